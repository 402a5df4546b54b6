//! `procs`: isolation by processes against Buffet — the Buffet paper's Fig. 6 analogue.
//!
//! The paper runs one Docker container or KVM VM per tenant on one core and finds Buffet
//! up to 3× ahead in throughput and 172× in latency. Here, without a hypervisor:
//!
//! - **processes**: one OS process per tenant running the single-tenant NF (this binary
//!   re-executed in NF mode: one state, the NF's own `init` and `handle`), fed by a
//!   dispatcher process through a pair of shared-memory rings per tenant (/dev/shm,
//!   [`procs_sys`](common/procs_sys.rs); single-producer single-consumer, each side
//!   caching the other's index as DPDK's rings do); every NF process pinned to core 0, so the kernel
//!   switches between them as between containers sharing a core. Each NF process polls
//!   its ring in batches of up to 32 packets; after 64 empty polls it yields the core
//!   (`sched_yield`), so an idle tenant gives its turn to a busy one instead of spinning
//!   out its timeslice — without that, throughput collapsed with the tenant count.
//! - **ns-processes** (as root): the same, each NF process also in its own network and
//!   PID namespace (`unshare --net --pid --fork`), as containers are.
//! - **buffet**: one worker thread on core 0 running `buffet_worker::Worker` over the
//!   same NF with every tenant's state in the Tenant Table, fed by the same dispatcher
//!   loop through one ring (bursts grouped per tenant), handing packets back a burst at a
//!   time through a [`Completions`] ring, as a pipeline's worker thread does.
//!
//! The dispatcher (core 1) sends every tenant's frames round robin, in two ways:
//!
//! - **saturated** (`load` = `window` in the output): it keeps at most `WINDOW` (32, or
//!   `BUFFET_PROCS_WINDOW`) packets of each tenant in flight (the same for every arm), so
//!   the offered load follows what the NF side sustains and each arm runs at its own
//!   saturation: its throughput, and the latency a closed loop of that many packets sees.
//!   Each turn it sends round robin, a packet per tenant with room per round, until every
//!   window is full or a burst (256) went out. In a closed loop the percentiles are taken
//!   over the packets that came back, so a tenant served often weighs more: the mean
//!   (which Little's law ties to the packets in flight) and the least-served tenant's
//!   share of the packets (`least`, 1.00 when every tenant got the same) are reported too
//!   (`mean_us` and `least_share` in the CSV);
//! - **at an offered load** (`load` = a fraction, `BUFFET_PROCS_LOADS`, default 0.5 and
//!   0.9): open loop at that fraction of the rate the `processes` arm carried saturated,
//!   the same rate for every arm, each packet stamped with the time it was due (so a late
//!   dispatcher does not hide the wait) and lost when its tenant already has `QUEUE` (256)
//!   packets queued, as a NIC queue overflows. This is the latency a tenant sees at a load
//!   both systems carry.
//!
//! Per arm: aggregate throughput (packets back per second), per-packet latency p50/p99
//! and mean from the dispatcher's timestamp to its receiving the packet back, at an
//! offered load the packets lost, and the least-served tenant's share. NFs: monitor,
//! firewall, ids, ipsec (outbound ESP); tenants 2, 4, 8, 16, 32, 64; 64-byte frames.
//!
//! Run: `cargo bench --bench procs` (about 10 minutes). Environment: `BUFFET_PROCS_NFS`,
//! `BUFFET_PROCS_TENANTS` (comma-separated), `BUFFET_PROCS_WINDOW` (packets of a
//! tenant in flight when saturated, 1 to 256), `BUFFET_PROCS_SECS` (measured seconds per
//! run, default 1), `BUFFET_PROCS_ROUNDS` (runs of every arm, default 1; with more, each
//! figure is the median over the rounds, with the throughput's and the p99's range, and
//! the arms alternate their order from round to round), `BUFFET_PROCS_YIELD` (`idle`,
//! the default: NF processes yield after 64 empty polls; `batch`: also after every
//! batch), `BUFFET_PROCS_LOADS`
//! (comma-separated fractions; empty for saturated runs only), `BUFFET_PROCS_CSV` (a file
//! for the CSV lines). `-- --test` is the smoke mode CI runs (one NF, 2 and 4 tenants,
//! 0.1 s).

#[path = "common/procs_sys.rs"]
mod procs_sys;
#[path = "common/report.rs"]
mod report;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use buffet::dispatch::TenantSlot;
use buffet::memory::{ArenaConfig, MemoryStorage, TenantTable};
use buffet::nfs::firewall::{Firewall, FirewallPolicy};
use buffet::nfs::ids::{Ids, IdsPolicy};
use buffet::nfs::ipsec::{Ipsec, IpsecPolicy};
use buffet::nfs::monitor::{Monitor, MonitorPolicy};
use buffet::sdk::{NetworkFunction, Packet, PacketMeta, TenantId, Verdict};
use buffet::worker::{Completions, PacketBuf, Worker};
use crossbeam::queue::ArrayQueue;
use procs_sys::{Dir, Shm, SlotHeader, MAX_FRAME, SLOT};
use report::{env_or, percentile};

/// Packets of one tenant in flight at most, in every arm, when the load follows the NF
/// side ([`Offer::Window`]), unless `BUFFET_PROCS_WINDOW` says otherwise.
const WINDOW: u64 = 32;
/// Packets of one tenant queued at most at an offered rate ([`Offer::Rate`]), in every
/// arm: a process's ring holds this many; a packet beyond it is lost, as a NIC queue
/// that overflows loses it.
const QUEUE: u64 = procs_sys::CAP;
/// Packets the Buffet worker takes from its input at most per burst.
const BURST: usize = 256;
/// Empty polls before an NF process yields the core.
const SPINS: u32 = 64;

/// Whether an NF process also yields the core after every batch it served
/// (`BUFFET_PROCS_YIELD=batch`), not only after [`SPINS`] empty polls (`idle`, the
/// default): a process whose ring never quite empties then still hands the core over
/// at once instead of at the end of its timeslice.
fn yield_each_batch() -> bool {
    match std::env::var("BUFFET_PROCS_YIELD").as_deref() {
        Err(_) | Ok("idle") => false,
        Ok("batch") => true,
        Ok(other) => panic!("BUFFET_PROCS_YIELD: {other:?} is neither `idle` nor `batch`"),
    }
}

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
    let each_batch = yield_each_batch();
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
            if each_batch {
                std::thread::yield_now();
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The dispatcher and its arms
// ---------------------------------------------------------------------------------------

/// How the dispatcher offers packets.
#[derive(Clone, Copy, Debug)]
enum Offer {
    /// Closed loop: at most this many packets of each tenant in flight ([`WINDOW`] by
    /// default), so the load follows what the NF side sustains.
    Window(u64),
    /// Open loop: this many packets a second, round robin over the tenants, whatever
    /// comes back (every arm at the same load). A packet is stamped with the time it was
    /// due, not the time it went out, so a dispatcher that falls behind does not hide
    /// the wait; one whose tenant already has [`QUEUE`] packets queued is lost.
    Rate(f64),
}

/// What one run measured.
struct Run {
    packets: u64,
    secs: f64,
    latencies_ns: Vec<u64>,
    /// Packets due in the measured part ([`Offer::Rate`]; 0 in a closed loop).
    offered: u64,
    /// Of those, lost to a full queue.
    lost: u64,
    /// Packets back in the measured part, per tenant.
    per_tenant: Vec<u64>,
}

/// The NF side the dispatcher talks to.
trait Side {
    /// Hands tenant `t`'s frame over; false when its queue is full.
    fn send(&mut self, t: u32, ts_ns: u64, frame: &[u8]) -> bool;
    /// Calls `done(tenant, ts_ns)` for every packet back.
    fn collect(&mut self, done: &mut dyn FnMut(u32, u64));
}

/// Drives `side` for `warm` then `secs` seconds, offering packets as `offer` says; the
/// measured part's figures.
fn dispatch(side: &mut dyn Side, tenants: u32, warm: f64, secs: f64, offer: Offer) -> Run {
    pin(1);
    let frames: Vec<Vec<Vec<u8>>> = (0..tenants)
        .map(|t| (0..64).map(|i| frame(t, i)).collect())
        .collect();
    let mut inflight = vec![0u64; tenants as usize];
    let mut next = vec![0usize; tenants as usize];
    let mut per_tenant = vec![0u64; tenants as usize];
    let start = Instant::now();
    let measure_from = (warm * 1e9) as u64;
    let end = ((warm + secs) * 1e9) as u64;
    // Room for every latency the run records, reserved up front: growing the vector
    // mid-run copies it, a stall of milliseconds that would land on the packets in flight.
    let expected = match offer {
        Offer::Rate(pps) => pps * (secs + 0.1),
        Offer::Window(_) => 40e6 * secs,
    };
    let mut lat = Vec::with_capacity((expected as usize).max(1 << 20));
    let (mut packets, mut offered, mut lost) = (0u64, 0u64, 0u64);
    let mut measuring = false;
    let mut measure_start = start;
    // Open loop: packets due so far, and the rate in packets per nanosecond.
    let mut due = 0u64;
    let per_ns = match offer {
        Offer::Rate(pps) => pps / 1e9,
        Offer::Window(_) => 0.0,
    };
    loop {
        let now = start.elapsed().as_nanos() as u64;
        if now >= end {
            break;
        }
        if !measuring && now >= measure_from {
            measuring = true;
            measure_start = Instant::now();
        }
        match offer {
            Offer::Window(window) => {
                // Round robin, a packet per tenant with room per round, until every
                // window is full or a burst went out: a turn's own cost (the clock, the
                // collection) is then shared by up to a burst of packets, not by one per
                // tenant, which had made this loop, not the NF side, the limit at 2 tenants.
                let mut turn = 0;
                loop {
                    let before = turn;
                    for t in 0..tenants as usize {
                        if inflight[t] < window {
                            let f = &frames[t][next[t] % 64];
                            if side.send(t as u32, now, f) {
                                inflight[t] += 1;
                                next[t] += 1;
                                turn += 1;
                            }
                        }
                    }
                    if turn == before || turn >= BURST {
                        break;
                    }
                }
            }
            Offer::Rate(_) => {
                // Every packet due by now, at most a burst of 256 before the returns are
                // collected again.
                let until = ((now as f64 * per_ns) as u64).min(due + 256);
                while due < until {
                    let t = (due % u64::from(tenants)) as usize;
                    let ts = (due as f64 / per_ns) as u64;
                    let f = &frames[t][next[t] % 64];
                    let sent = inflight[t] < QUEUE && side.send(t as u32, ts, f);
                    if sent {
                        inflight[t] += 1;
                        next[t] += 1;
                    }
                    if ts >= measure_from {
                        offered += 1;
                        lost += u64::from(!sent);
                    }
                    due += 1;
                }
            }
        }
        let at = start.elapsed().as_nanos() as u64;
        side.collect(&mut |t, sent| {
            inflight[t as usize] -= 1;
            if measuring {
                packets += 1;
                per_tenant[t as usize] += 1;
                lat.push(at.saturating_sub(sent));
            }
        });
    }
    let secs = measure_start.elapsed().as_secs_f64();
    Run {
        packets,
        secs,
        latencies_ns: lat,
        offered,
        lost,
        per_tenant,
    }
}

/// How often the dispatcher's core stalls on its own: for `secs` seconds, pinned where the
/// dispatcher runs, read the clock back to back and add up the gaps over 20 µs (the
/// hypervisor or the kernel taking the core). Returns (gaps, their share of the time,
/// the longest in µs). Every packet due during a gap waits for it, in every arm: when
/// the share is over 1 %, no arm's p99 can be below about the gaps' length.
fn stalls(secs: f64) -> (u64, f64, f64) {
    pin(1);
    let start = Instant::now();
    let end = (secs * 1e9) as u64;
    let (mut prev, mut gaps, mut total, mut longest) = (0u64, 0u64, 0u64, 0u64);
    loop {
        let now = start.elapsed().as_nanos() as u64;
        let gap = now - prev;
        if gap > 20_000 {
            gaps += 1;
            total += gap;
            longest = longest.max(gap);
        }
        prev = now;
        if now >= end {
            break;
        }
    }
    (
        gaps,
        100.0 * total as f64 / end as f64,
        longest as f64 / 1e3,
    )
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
    back: Arc<Completions>,
    free: Vec<PacketBuf>,
    stop: Arc<AtomicBool>,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl Buffet {
    fn start(nf: &str, tenants: u32) -> Buffet {
        let ring = (u64::from(tenants) * QUEUE) as usize;
        let to_worker = Arc::new(ArrayQueue::new(ring));
        // As a pipeline's worker: frames in one by one, back a burst at a time.
        let back = Arc::new(Completions::new(ring));
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
    tx: &Completions,
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
    let mut burst = Vec::with_capacity(BURST);
    while !stop.load(Ordering::Relaxed) {
        while burst.len() < BURST {
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
        tx.send(&mut burst);
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
        while let Some(mut batch) = self.back.take() {
            for b in batch.drain(..) {
                done(b.tenant.0, b.ts_ns);
                self.free.push(b);
            }
            self.back.recycle(batch);
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
    /// The mean latency: in a closed loop, what Little's law ties to the packets in
    /// flight, however the percentiles split it.
    mean_us: f64,
    /// The least-served tenant's packets as a fraction of the tenants' mean.
    least_share: f64,
    /// Packets due per second, in thousands ([`Offer::Rate`]; 0 in a closed loop).
    offered_kpps: f64,
    /// Percent of the packets due that were lost to a full queue.
    lost_pct: f64,
}

/// Runs `arm` for `nf` with `n` tenants once.
fn measure(nf: &str, n: u32, arm: &str, warm: f64, secs: f64, offer: Offer) -> Measure {
    let mut run = match arm {
        "buffet" => dispatch(&mut Buffet::start(nf, n), n, warm, secs, offer),
        a => dispatch(
            &mut Processes::start(nf, n, a == "ns-processes"),
            n,
            warm,
            secs,
            offer,
        ),
    };
    run.latencies_ns.sort_unstable();
    Measure {
        kpps: run.packets as f64 / run.secs / 1e3,
        p50_us: percentile(&run.latencies_ns, 0.5) / 1e3,
        p99_us: percentile(&run.latencies_ns, 0.99) / 1e3,
        mean_us: run.latencies_ns.iter().sum::<u64>() as f64
            / run.latencies_ns.len().max(1) as f64
            / 1e3,
        least_share: {
            let mean = run.packets as f64 / run.per_tenant.len().max(1) as f64;
            run.per_tenant
                .iter()
                .min()
                .map_or(0.0, |&m| m as f64 / mean.max(1.0))
        },
        offered_kpps: run.offered as f64 / secs / 1e3,
        lost_pct: if run.offered == 0 {
            0.0
        } else {
            100.0 * run.lost as f64 / run.offered as f64
        },
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
    let loads: Vec<f64> = env_or("BUFFET_PROCS_LOADS", "0.5,0.9".to_owned())
        .split(',')
        .filter(|l| !l.trim().is_empty())
        .map(|l| match l.trim().parse::<f64>() {
            Ok(f) if f > 0.0 && f.is_finite() => f,
            _ => panic!("BUFFET_PROCS_LOADS: {l:?} is not a positive fraction"),
        })
        .collect();
    let window: u64 = env_or("BUFFET_PROCS_WINDOW", WINDOW);
    assert!(
        (1..=QUEUE).contains(&window),
        "BUFFET_PROCS_WINDOW: {window} is not a number of packets from 1 to {QUEUE}"
    );
    let warm = secs * 0.3;
    // The NF processes inherit the environment; read it here first, so a bad value
    // fails before any process starts.
    let each_batch = yield_each_batch();
    let root = buffet_testkit::gate::is_root()
        && Command::new("unshare").arg("--version").output().is_ok();
    let cores = cores().len().max(1);
    println!(
        "procs: NF side on core 0, dispatcher on core {}; NF processes yield {}; window {window} packets per tenant, \
         then offered loads {loads:?} of the processes' rate with {QUEUE} packets queued per \
         tenant at most; {secs} s per run, {rounds} round(s){}",
        1 % cores,
        if each_batch {
            "after every batch and when idle"
        } else {
            "when idle"
        },
        if root {
            ""
        } else {
            " (ns-processes needs root and unshare: skipped)"
        }
    );
    let (gaps, share, longest) = stalls(secs.min(1.0));
    println!(
        "procs: the dispatcher's core stalled {gaps} times over 20 µs in {:.1} s with nothing \
         else running ({share:.2} % of the time, the longest {longest:.0} µs): packets due \
         then wait, in every arm",
        secs.min(1.0)
    );
    println!(
        "{:<9} {:>7} {:<13} {:>6} {:>11} {:>10} {:>10} {:>10} {:>7} {:>6}  {}",
        "nf",
        "tenants",
        "arm",
        "load",
        "kpps",
        "p50 µs",
        "p99 µs",
        "mean µs",
        "lost %",
        "least",
        if rounds > 1 {
            "(medians; kpps and p99 ranges)"
        } else {
            ""
        }
    );
    let mut csv = String::from(
        "nf,tenants,arm,kpps,p50_us,p99_us,rounds,kpps_min,kpps_max,p99_min_us,p99_max_us,load,offered_kpps,lost_pct,mean_us,least_share\n",
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
            // Each arm at its own saturation first; then every arm at the same offered
            // loads, fractions of what the processes carried.
            let mut capacity = 0.0;
            for load in std::iter::once(None).chain(loads.iter().copied().map(Some)) {
                let offer = match load {
                    None => Offer::Window(window),
                    Some(f) => Offer::Rate(f * capacity * 1e3),
                };
                // Every arm once per round, in the opposite order in every other round,
                // so a drift of the machine falls on all arms alike.
                let mut measured: Vec<Vec<Measure>> = vec![Vec::new(); arms.len()];
                for round in 0..rounds {
                    let mut order: Vec<usize> = (0..arms.len()).collect();
                    if round % 2 == 1 {
                        order.reverse();
                    }
                    for i in order {
                        measured[i].push(measure(nf, n, arms[i], warm, secs, offer));
                    }
                }
                let label = load.map_or("window".to_owned(), |f| format!("{f:.2}"));
                for (arm, ms) in arms.iter().zip(&measured) {
                    let kpps = Spread::of(ms.iter().map(|m| m.kpps));
                    let p50 = Spread::of(ms.iter().map(|m| m.p50_us));
                    let p99 = Spread::of(ms.iter().map(|m| m.p99_us));
                    let offered = Spread::of(ms.iter().map(|m| m.offered_kpps));
                    let lost = Spread::of(ms.iter().map(|m| m.lost_pct));
                    let mean = Spread::of(ms.iter().map(|m| m.mean_us));
                    let least = Spread::of(ms.iter().map(|m| m.least_share));
                    if load.is_none() && *arm == "processes" {
                        capacity = kpps.median;
                    }
                    let ranges = if rounds > 1 {
                        format!(
                            "  ({:.1}–{:.1}; {:.1}–{:.1})",
                            kpps.min, kpps.max, p99.min, p99.max
                        )
                    } else {
                        String::new()
                    };
                    println!(
                        "{nf:<9} {n:>7} {arm:<13} {label:>6} {:>11.1} {:>10.1} {:>10.1} {:>10.1} {:>7.2} {:>6.2}{ranges}",
                        kpps.median, p50.median, p99.median, mean.median, lost.median, least.median
                    );
                    csv.push_str(&format!(
                        "{nf},{n},{arm},{:.1},{:.1},{:.1},{rounds},{:.1},{:.1},{:.1},{:.1},{label},{:.1},{:.2},{:.1},{:.2}\n",
                        kpps.median,
                        p50.median,
                        p99.median,
                        kpps.min,
                        kpps.max,
                        p99.min,
                        p99.max,
                        offered.median,
                        lost.median,
                        mean.median,
                        least.median
                    ));
                }
            }
        }
    }
    if let Ok(path) = std::env::var("BUFFET_PROCS_CSV") {
        std::fs::write(&path, csv).unwrap_or_else(|e| panic!("{path}: {e}"));
    }
}
