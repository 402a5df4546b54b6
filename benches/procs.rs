//! `procs`: isolation by processes against Buffet — the Buffet paper's Fig. 6 analogue.
//!
//! The paper runs one Docker container or KVM VM per tenant on one core and finds Buffet
//! up to 3× ahead in throughput and 172× in latency. Here, without a hypervisor:
//!
//! - **processes**: one OS process per tenant running the single-tenant NF (this binary
//!   re-executed in NF mode: one state, the NF's own `init` and `handle`), fed by a
//!   dispatcher process through a pair of shared-memory rings per tenant (/dev/shm,
//!   [`procs_sys`](common/procs_sys.rs)); every NF process pinned to core 0, so the kernel
//!   switches between them as between containers sharing a core. Each NF process polls
//!   its ring in batches of up to 32 packets; after 64 empty polls it yields the core
//!   (`sched_yield`), so an idle tenant gives its turn to a busy one instead of spinning
//!   out its timeslice — without that, throughput collapsed with the tenant count.
//! - **ns-processes** (as root): the same, each NF process also in its own network and
//!   PID namespace (`unshare --net --pid --fork`), as containers are.
//! - **buffet**: one worker thread on core 0 running `buffet_worker::Worker` over the
//!   same NF with every tenant's state in the Tenant Table, fed by the same dispatcher
//!   loop through one ring (bursts grouped per tenant).
//!
//! The dispatcher (core 1) sends every tenant's frames round robin and keeps at most
//! `WINDOW` packets of each tenant in flight (the same for every arm), so the offered
//! load follows what the NF side sustains. Per arm: aggregate throughput (packets back per
//! second) and per-packet latency p50/p99 from the dispatcher's send timestamp to its
//! receiving the packet back. NFs: monitor, firewall, ids, ipsec (outbound ESP); tenants
//! 2, 4, 8, 16, 32, 64; 64-byte frames.
//!
//! Run: `cargo bench --bench procs` (about 3 minutes). Environment: `BUFFET_PROCS_NFS`,
//! `BUFFET_PROCS_TENANTS` (comma-separated), `BUFFET_PROCS_SECS` (measured seconds per
//! run, default 1), `BUFFET_PROCS_ROUNDS` (runs of every arm, default 1; with more, each
//! figure is the median over the rounds, with the throughput's and the p99's range, and
//! the arms alternate their order from round to round), `BUFFET_PROCS_CSV` (a file for
//! the CSV lines). `-- --test` is the smoke mode CI runs (one NF, 2 and 4 tenants, 0.1 s).

#[path = "common/procs_sys.rs"]
mod procs_sys;
#[path = "common/report.rs"]
mod report;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use buffet::dispatch::TenantSlot;
use buffet::memory::{ArenaConfig, MemoryStorage, TenantTable};
use buffet::nfs::firewall::{Firewall, FirewallPolicy};
use buffet::nfs::ids::{Ids, IdsPolicy};
use buffet::nfs::ipsec::{Ipsec, IpsecPolicy};
use buffet::nfs::monitor::{Monitor, MonitorPolicy};
use buffet::sdk::{NetworkFunction, Packet, PacketMeta, TenantId, Verdict};
use buffet::worker::{PacketBuf, Worker};
use crossbeam::queue::ArrayQueue;
use procs_sys::{Dir, Shm, SlotHeader, MAX_FRAME, SLOT};
use report::{env_or, percentile};

/// Packets of one tenant in flight at most, in every arm.
const WINDOW: u64 = 32;
/// Empty polls before an NF process yields the core.
const SPINS: u32 = 64;

/// Tenant `t`'s policy for `nf`, as JSON (the tenants file's `[tenant.policy]`).
fn policy(nf: &str, t: u32) -> serde_json::Value {
    match nf {
        "firewall" => serde_json::json!({
            "default": "allow",
            "rules": [
                { "action": "deny", "proto": "udp", "dst_port": 22 },
                { "action": "deny", "proto": "udp", "dst_port": 23 },
            ],
        }),
        "ids" => serde_json::json!({
            "rules": "alert udp any any (msg:\"a\"; content:\"attack\"; sid:1;)\n\
                      alert udp any 53 (msg:\"b\"; content:\"|de ad be ef|\"; sid:2;)\n\
                      alert tcp any 80 (msg:\"c\"; content:\"evil\"; nocase; sid:3;)\n",
        }),
        "ipsec" => serde_json::json!({
            "outbound": [{
                "spi": 0x1000 + t,
                "key": format!("{:02x}", t % 256).repeat(36),
                "local": "203.0.113.1",
                "remote": "198.51.100.1",
                "selector": format!("10.{}.{}.0/24", t / 256, t % 256),
            }],
        }),
        _ => serde_json::json!({}),
    }
}

/// Frame `i` of tenant `t`: UDP to 10.(t/256).(t%256).x, 64 bytes.
fn frame(t: u32, i: u32) -> Vec<u8> {
    let mut v = Vec::new();
    etherparse::PacketBuilder::ethernet2([2; 6], [4; 6])
        .ipv4(
            [192, 168, 0, 1],
            [10, (t / 256) as u8, (t % 256) as u8, (i % 200) as u8 + 1],
            64,
        )
        .udp(40000 + (i % 64) as u16, 53)
        .write(&mut v, &[0x5a; 22])
        .expect("frame");
    v
}

/// The cores this process may use, read once before anything is pinned (a pinned
/// thread's children see only its core), and handed to the NF processes in
/// `BUFFET_PROCS_CORES`.
fn cores() -> &'static [usize] {
    static CORES: std::sync::OnceLock<Vec<usize>> = std::sync::OnceLock::new();
    CORES.get_or_init(|| match std::env::var("BUFFET_PROCS_CORES") {
        Ok(list) => list.split(',').filter_map(|c| c.parse().ok()).collect(),
        Err(_) => core_affinity::get_core_ids()
            .map(|ids| ids.into_iter().map(|c| c.id).collect())
            .unwrap_or_default(),
    })
}

fn pin(core: usize) {
    let cores = cores();
    if !cores.is_empty() {
        core_affinity::set_for_current(core_affinity::CoreId {
            id: cores[core % cores.len()],
        });
    }
}

// ---------------------------------------------------------------------------------------
// NF process
// ---------------------------------------------------------------------------------------

fn nf_process(path: &Path, nf: &str, tenant: u32) {
    pin(0);
    let shm = Shm::open(path).expect("shm");
    let p = policy(nf, tenant);
    match nf {
        "monitor" => serve(
            &shm,
            Monitor::default(),
            serde_json::from_value::<MonitorPolicy>(p),
        ),
        "firewall" => serve(
            &shm,
            Firewall::default(),
            serde_json::from_value::<FirewallPolicy>(p),
        ),
        "ids" => serve(&shm, Ids::default(), serde_json::from_value::<IdsPolicy>(p)),
        "ipsec" => serve(
            &shm,
            Ipsec::default(),
            serde_json::from_value::<IpsecPolicy>(p),
        ),
        other => panic!("unknown NF {other}"),
    }
}

/// The single-tenant NF over its rings until told to stop.
fn serve<N: NetworkFunction>(shm: &Shm, nf: N, policy: Result<N::Policy, serde_json::Error>) {
    let policy = policy.expect("policy");
    let mut state = N::State::default();
    nf.init(&policy, &mut state).expect("init");
    let mut buf = vec![0u8; SLOT];
    let mut idle = 0u32;
    while !shm.stopping() {
        let mut n = 0;
        while n < 32 {
            let Some(h) = shm.pop(Dir::ToNf, &mut buf) else {
                break;
            };
            n += 1;
            let meta = PacketMeta {
                ts_ns: h.ts_ns,
                ..PacketMeta::default()
            };
            let len = match Packet::parse_with_capacity(&mut buf[..MAX_FRAME], h.len as usize, meta)
            {
                Ok(mut pkt) => match nf.handle(&mut pkt, &mut state) {
                    Verdict::Drop(_) => 0,
                    _ => pkt.len(),
                },
                Err(_) => 0,
            };
            let back = SlotHeader {
                len: len as u32,
                ..h
            };
            // The window keeps the back ring from filling.
            while !shm.push(Dir::Back, back, &buf[..len]) {
                std::thread::yield_now();
            }
        }
        if n == 0 {
            idle += 1;
            if idle >= SPINS {
                idle = 0;
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        } else {
            idle = 0;
        }
    }
}

// ---------------------------------------------------------------------------------------
// The dispatcher and its arms
// ---------------------------------------------------------------------------------------

/// What one run measured.
struct Run {
    packets: u64,
    secs: f64,
    latencies_ns: Vec<u64>,
}

/// The NF side the dispatcher talks to.
trait Side {
    /// Hands tenant `t`'s frame over; false when its queue is full.
    fn send(&mut self, t: u32, ts_ns: u64, frame: &[u8]) -> bool;
    /// Calls `done(tenant, ts_ns)` for every packet back.
    fn collect(&mut self, done: &mut dyn FnMut(u32, u64));
}

/// Drives `side` for `warm` then `secs` seconds; the measured part's figures.
fn dispatch(side: &mut dyn Side, tenants: u32, warm: f64, secs: f64) -> Run {
    pin(1);
    let frames: Vec<Vec<Vec<u8>>> = (0..tenants)
        .map(|t| (0..64).map(|i| frame(t, i)).collect())
        .collect();
    let mut inflight = vec![0u64; tenants as usize];
    let mut next = vec![0usize; tenants as usize];
    let start = Instant::now();
    let measure_from = Duration::from_secs_f64(warm);
    let end = Duration::from_secs_f64(warm + secs);
    let mut lat = Vec::with_capacity(1 << 20);
    let mut packets = 0u64;
    let mut measuring = false;
    let mut measure_start = start;
    loop {
        let now = start.elapsed();
        if now >= end {
            break;
        }
        if !measuring && now >= measure_from {
            measuring = true;
            measure_start = Instant::now();
        }
        let ts = now.as_nanos() as u64;
        for t in 0..tenants as usize {
            if inflight[t] < WINDOW {
                let f = &frames[t][next[t] % 64];
                if side.send(t as u32, ts, f) {
                    inflight[t] += 1;
                    next[t] += 1;
                }
            }
        }
        let at = start.elapsed().as_nanos() as u64;
        side.collect(&mut |t, sent| {
            inflight[t as usize] -= 1;
            if measuring {
                packets += 1;
                lat.push(at.saturating_sub(sent));
            }
        });
    }
    let secs = measure_start.elapsed().as_secs_f64();
    Run {
        packets,
        secs,
        latencies_ns: lat,
    }
}

/// NF processes, one per tenant.
struct Processes {
    shms: Vec<Shm>,
    children: Vec<Child>,
    paths: Vec<PathBuf>,
    buf: Vec<u8>,
}

impl Processes {
    fn start(nf: &str, tenants: u32, namespaces: bool) -> Processes {
        let exe = std::env::current_exe().unwrap();
        let mut p = Processes {
            shms: Vec::new(),
            children: Vec::new(),
            paths: Vec::new(),
            buf: vec![0u8; SLOT],
        };
        for t in 0..tenants {
            let path = PathBuf::from(format!("/dev/shm/buffet-procs-{}-{t}", std::process::id()));
            p.shms.push(Shm::create(&path).expect("/dev/shm"));
            let mut cmd = if namespaces {
                let mut c = Command::new("unshare");
                c.args(["--net", "--pid", "--fork"]).arg(&exe);
                c
            } else {
                Command::new(&exe)
            };
            let child = cmd
                .env("BUFFET_PROCS_CHILD", &path)
                .env(
                    "BUFFET_PROCS_CORES",
                    cores()
                        .iter()
                        .map(|c| c.to_string())
                        .collect::<Vec<_>>()
                        .join(","),
                )
                .env("BUFFET_PROCS_NF", nf)
                .env("BUFFET_PROCS_TENANT", t.to_string())
                .stdin(Stdio::null())
                .spawn()
                .expect("spawn NF process");
            p.children.push(child);
            p.paths.push(path);
        }
        p
    }
}

impl Side for Processes {
    fn send(&mut self, t: u32, ts_ns: u64, frame: &[u8]) -> bool {
        let h = SlotHeader {
            len: frame.len() as u32,
            tenant: t,
            ts_ns,
        };
        self.shms[t as usize].push(Dir::ToNf, h, frame)
    }

    fn collect(&mut self, done: &mut dyn FnMut(u32, u64)) {
        for shm in &self.shms {
            while let Some(h) = shm.pop(Dir::Back, &mut self.buf) {
                done(h.tenant, h.ts_ns);
            }
        }
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for s in &self.shms {
            s.stop();
        }
        for c in &mut self.children {
            let _ = c.wait();
        }
        for p in &self.paths {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Buffet: one worker thread over a Tenant Table of every tenant.
struct Buffet {
    to_worker: Arc<ArrayQueue<PacketBuf>>,
    back: Arc<ArrayQueue<PacketBuf>>,
    free: Vec<PacketBuf>,
    stop: Arc<AtomicBool>,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl Buffet {
    fn start(nf: &str, tenants: u32) -> Buffet {
        let ring = (tenants as u64 * WINDOW) as usize;
        let to_worker = Arc::new(ArrayQueue::new(ring));
        let back = Arc::new(ArrayQueue::new(ring));
        let stop = Arc::new(AtomicBool::new(false));
        let worker = {
            let (rx, tx, stop, nf) = (to_worker.clone(), back.clone(), stop.clone(), nf.to_owned());
            std::thread::spawn(move || match nf.as_str() {
                "monitor" => work(Monitor::default(), tenants, &nf, &rx, &tx, &stop),
                "firewall" => work(Firewall::default(), tenants, &nf, &rx, &tx, &stop),
                "ids" => work(Ids::default(), tenants, &nf, &rx, &tx, &stop),
                "ipsec" => work(Ipsec::default(), tenants, &nf, &rx, &tx, &stop),
                other => panic!("unknown NF {other}"),
            })
        };
        Buffet {
            to_worker,
            back,
            free: (0..ring).map(|_| PacketBuf::heap()).collect(),
            stop,
            worker: Some(worker),
        }
    }
}

fn work<N: NetworkFunction>(
    nf: N,
    tenants: u32,
    name: &str,
    rx: &ArrayQueue<PacketBuf>,
    tx: &ArrayQueue<PacketBuf>,
    stop: &AtomicBool,
) {
    pin(0);
    let bytes = nf.register().bytes;
    let per_tenant = (bytes.div_ceil(64 << 10) + 2) * (64 << 10);
    let storage = MemoryStorage::new(ArenaConfig {
        capacity: per_tenant * tenants as usize + (16 << 20),
    })
    .expect("arena");
    let table = Arc::new(TenantTable::new(storage, tenants));
    for t in 0..tenants {
        let p: N::Policy = serde_json::from_value(policy(name, t)).expect("policy");
        let mut state = N::State::default();
        nf.init(&p, &mut state).expect("init");
        table
            .admit(TenantSlot(t), TenantId(t + 1), bytes, state)
            .expect("admit");
    }
    let mut w = Worker::new(Arc::new(nf), table);
    let mut burst = Vec::with_capacity(256);
    while !stop.load(Ordering::Relaxed) {
        while burst.len() < 256 {
            match rx.pop() {
                Some(b) => burst.push(b),
                None => break,
            }
        }
        if burst.is_empty() {
            std::hint::spin_loop();
            continue;
        }
        w.process(&mut burst);
        for b in burst.drain(..) {
            let _ = tx.push(b);
        }
    }
}

impl Side for Buffet {
    fn send(&mut self, t: u32, ts_ns: u64, frame: &[u8]) -> bool {
        let Some(mut b) = self.free.pop() else {
            return false;
        };
        b.fill(frame);
        b.tenant = TenantSlot(t);
        b.ts_ns = ts_ns;
        match self.to_worker.push(b) {
            Ok(()) => true,
            Err(b) => {
                self.free.push(b);
                false
            }
        }
    }

    fn collect(&mut self, done: &mut dyn FnMut(u32, u64)) {
        while let Some(b) = self.back.pop() {
            done(b.tenant.0, b.ts_ns);
            self.free.push(b);
        }
    }
}

impl Drop for Buffet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// One run of one arm: throughput and latency percentiles.
#[derive(Clone, Copy)]
struct Measure {
    kpps: f64,
    p50_us: f64,
    p99_us: f64,
}

/// Runs `arm` for `nf` with `n` tenants once.
fn measure(nf: &str, n: u32, arm: &str, warm: f64, secs: f64) -> Measure {
    let mut run = match arm {
        "buffet" => dispatch(&mut Buffet::start(nf, n), n, warm, secs),
        a => dispatch(
            &mut Processes::start(nf, n, a == "ns-processes"),
            n,
            warm,
            secs,
        ),
    };
    run.latencies_ns.sort_unstable();
    Measure {
        kpps: run.packets as f64 / run.secs / 1e3,
        p50_us: percentile(&run.latencies_ns, 0.5) / 1e3,
        p99_us: percentile(&run.latencies_ns, 0.99) / 1e3,
    }
}

/// Median, minimum and maximum of one metric over the rounds.
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

impl Spread {
    fn of(xs: impl Iterator<Item = f64>) -> Spread {
        let mut v: Vec<f64> = xs.collect();
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        let median = if v.len() % 2 == 1 {
            v[mid]
        } else {
            (v[mid - 1] + v[mid]) / 2.0
        };
        Spread {
            median,
            min: v[0],
            max: v[v.len() - 1],
        }
    }
}

fn main() {
    if let Ok(path) = std::env::var("BUFFET_PROCS_CHILD") {
        let nf = std::env::var("BUFFET_PROCS_NF").unwrap();
        let t: u32 = env_or("BUFFET_PROCS_TENANT", 0);
        nf_process(Path::new(&path), &nf, t);
        return;
    }
    let smoke = std::env::args().any(|a| a == "--test");
    let nfs: String = env_or(
        "BUFFET_PROCS_NFS",
        if smoke {
            "monitor"
        } else {
            "monitor,firewall,ids,ipsec"
        }
        .to_owned(),
    );
    let counts: String = env_or(
        "BUFFET_PROCS_TENANTS",
        if smoke { "2,4" } else { "2,4,8,16,32,64" }.to_owned(),
    );
    let secs: f64 = env_or("BUFFET_PROCS_SECS", if smoke { 0.1 } else { 1.0 });
    let rounds: usize = env_or("BUFFET_PROCS_ROUNDS", 1usize).max(1);
    let warm = secs * 0.3;
    let root = buffet_testkit::gate::is_root()
        && Command::new("unshare").arg("--version").output().is_ok();
    let cores = cores().len().max(1);
    println!(
        "procs: NF side on core 0, dispatcher on core {}; window {WINDOW} packets per tenant; {secs} s per run, {rounds} round(s){}",
        1 % cores,
        if root { "" } else { " (ns-processes needs root and unshare: skipped)" }
    );
    println!(
        "{:<9} {:>7} {:<13} {:>11} {:>10} {:>10}  {}",
        "nf",
        "tenants",
        "arm",
        "kpps",
        "p50 µs",
        "p99 µs",
        if rounds > 1 {
            "(medians; kpps and p99 ranges)"
        } else {
            ""
        }
    );
    let mut csv = String::from(
        "nf,tenants,arm,kpps,p50_us,p99_us,rounds,kpps_min,kpps_max,p99_min_us,p99_max_us\n",
    );
    for nf in nfs.split(',') {
        for n in counts
            .split(',')
            .map(|c| c.parse::<u32>().expect("tenant count"))
        {
            let mut arms: Vec<&str> = vec!["buffet", "processes"];
            if root {
                arms.push("ns-processes");
            }
            // Every arm once per round, in the opposite order in every other round, so a
            // drift of the machine falls on all arms alike.
            let mut measured: Vec<Vec<Measure>> = vec![Vec::new(); arms.len()];
            for round in 0..rounds {
                let mut order: Vec<usize> = (0..arms.len()).collect();
                if round % 2 == 1 {
                    order.reverse();
                }
                for i in order {
                    measured[i].push(measure(nf, n, arms[i], warm, secs));
                }
            }
            for (arm, ms) in arms.iter().zip(&measured) {
                let kpps = Spread::of(ms.iter().map(|m| m.kpps));
                let p50 = Spread::of(ms.iter().map(|m| m.p50_us));
                let p99 = Spread::of(ms.iter().map(|m| m.p99_us));
                let ranges = if rounds > 1 {
                    format!(
                        "  ({:.1}–{:.1}; {:.1}–{:.1})",
                        kpps.min, kpps.max, p99.min, p99.max
                    )
                } else {
                    String::new()
                };
                println!(
                    "{nf:<9} {n:>7} {arm:<13} {:>11.1} {:>10.1} {:>10.1}{ranges}",
                    kpps.median, p50.median, p99.median
                );
                csv.push_str(&format!(
                    "{nf},{n},{arm},{:.1},{:.1},{:.1},{rounds},{:.1},{:.1},{:.1},{:.1}\n",
                    kpps.median, p50.median, p99.median, kpps.min, kpps.max, p99.min, p99.max
                ));
            }
        }
    }
    if let Ok(path) = std::env::var("BUFFET_PROCS_CSV") {
        std::fs::write(&path, csv).unwrap_or_else(|e| panic!("{path}: {e}"));
    }
}
