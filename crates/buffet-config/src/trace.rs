//! `buffet trace`: the timeslot scheduler alone, over a `ts_ns,tenant_id` trace; and,
//! in [`frames`], the classifier and the scheduler together over a `ts_ns,hex_frame`
//! trace of whole Ethernet frames with a tenants file (`buffet trace --frames`).
//!
//! This is the yardstick that proves the Rust dispatcher, the C core and the XDP program
//! equal: each reads the same trace and must print the same bytes. The [`TraceEngine`]
//! chooses the implementation: `rust` (buffet-dispatch's [`Dispatcher`], the default),
//! `c` (nic-firmware/common compiled for the host, through buffet-nicfw's
//! [`CScheduler`]) or `xdp` (nic-firmware/xdp's program in the kernel, through
//! buffet-xdp, one BPF_PROG_TEST_RUN per packet with the trace's timestamp injected:
//! [`XdpTrace`]). All implement [`TraceScheduler`], so one runner loop drives each. The
//! committed vectors under tests/vectors/ are checked against every engine.
//!
//! The `xdp` engine needs CAP_BPF and a build with clang; without them it stops before
//! the first packet with [`TraceError::EngineUnavailable`] or [`TraceError::Engine`]. Its
//! maps hold [`buffet_xdp::MAX_WORKERS`] workers and [`buffet_xdp::MAX_TENANTS`] tenants:
//! a trace beyond them stops with an error (line [`LineError::TooManyTenants`] for the
//! tenants).
//!
//! Input, one packet per line: `ts_ns,tenant_id` (decimal `u64`, decimal `u32`, ASCII
//! digits only; spaces or tabs around a field are ignored, as is a trailing `\r`).
//! Blank lines and lines whose first non-blank character is `#` are skipped, and so is
//! one header line `ts_ns,tenant_id` before the first packet. Anything else is an error
//! naming its (1-based) line, and processing stops there.
//!
//! Semantics: `workers` (K) workers, each with MAX_NB `worker_max`. A tenant is created
//! the first time its id appears: the next dense slot (order of first appearance), on
//! worker `tenant_id % K`, with MAX_NB `tenant_max` (0: unlimited). Each packet then goes
//! through the engine's scheduler step (with `rust`, [`Dispatcher::schedule_tagged`]; the
//! scheduler of docs/scheduler.md, timeslot = `ts_ns >> shift`).
//!
//! Output, to `out`, one line per packet: `seq,tenant_id,action,worker` with `seq`
//! counting input packets from 0, `action` `pass` or `drop`, and `worker` empty on a
//! drop (`3,7,drop,`). To `err`, one line per overload report: `overload,seq,worker,slot`
//! (`seq` of the packet that raised it). Lines end with `\n`. Nothing else is written;
//! pass buffered writers.

pub mod frames;

use std::io::{self, BufRead, Write};

use buffet_dispatch::scheduler::{SchedOutcome, MAX_TENANT_SLOTS};
use buffet_dispatch::{
    Decision, DispatchDrop, Dispatcher, DispatcherConfig, Event, SchedulerConfig, TagMode,
    TenantId, TenantSlot, UnmatchedPolicy, WorkerId,
};
use std::net::{IpAddr, Ipv4Addr};

use buffet_dispatch::{IpPrefix, Match};
use buffet_nicfw::CScheduler;
use buffet_sdk::TenantRegistry;
use buffet_xdp::{XdpConfig, XdpDecision, XdpDispatcher};

/// Which implementation of the scheduler step runs a trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum TraceEngine {
    /// buffet-dispatch's Packet Dispatcher (the reference).
    #[default]
    Rust,
    /// nic-firmware/common, the portable C core, compiled for the host.
    C,
    /// The XDP dispatcher in the kernel, under BPF_PROG_TEST_RUN.
    Xdp,
}

impl TraceEngine {
    /// `rust`, `c` or `xdp`.
    pub const fn name(self) -> &'static str {
        match self {
            TraceEngine::Rust => "rust",
            TraceEngine::C => "c",
            TraceEngine::Xdp => "xdp",
        }
    }
}

impl std::fmt::Display for TraceEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The scheduler refused to admit a tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the scheduler refused the tenant")]
pub struct TraceAdmitError;

/// An engine failed for a reason of its own (the kernel refused a map write, a test run).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The XDP dispatcher refused a worker.
    #[error(transparent)]
    XdpAdmit(#[from] buffet_xdp::AdmitError),
    /// Loading the XDP dispatcher failed.
    #[error(transparent)]
    XdpLoad(#[from] buffet_xdp::LoadError),
    /// Running a packet through the XDP dispatcher failed.
    #[error(transparent)]
    XdpRun(#[from] buffet_xdp::RunError),
}

/// What the trace runner needs from a scheduler implementation: workers, tenants, and
/// one scheduling step per packet (with the migration and overload report it caused).
pub trait TraceScheduler {
    /// Adds a live worker with MAX_NB `max_nb`.
    fn add_worker(&mut self, max_nb: u64) -> Result<(), EngineError>;
    /// Admits a tenant in tenant slot `slot` on `worker` with MAX_NB `max_nb`.
    fn admit(
        &mut self,
        slot: TenantSlot,
        worker: WorkerId,
        max_nb: u64,
    ) -> Result<(), TraceAdmitError>;
    /// One scheduling step for a packet of `slot` at `ts_ns`.
    fn schedule(&mut self, ts_ns: u64, slot: TenantSlot) -> Result<SchedOutcome, EngineError>;
}

impl TraceScheduler for Dispatcher {
    fn add_worker(&mut self, max_nb: u64) -> Result<(), EngineError> {
        Dispatcher::add_worker(self, max_nb);
        Ok(())
    }

    fn admit(
        &mut self,
        slot: TenantSlot,
        worker: WorkerId,
        max_nb: u64,
    ) -> Result<(), TraceAdmitError> {
        self.admit_on(slot, Vec::new(), max_nb, worker)
            .map(|_| ())
            .map_err(|_| TraceAdmitError)
    }

    fn schedule(&mut self, ts_ns: u64, slot: TenantSlot) -> Result<SchedOutcome, EngineError> {
        Ok(match self.schedule_tagged(ts_ns, slot) {
            Decision::Pass { worker, .. } => passed(self, worker),
            Decision::Drop(DispatchDrop::Policed(_)) => SchedOutcome::Policed,
            Decision::Drop(DispatchDrop::NoLiveWorker) => SchedOutcome::NoLiveWorker,
            Decision::Drop(_) => SchedOutcome::UnknownTenant,
        })
    }
}

/// The Rust dispatcher's pass to `worker`, with the migration and overload report it
/// raised (its events, drained), as the scheduler step's outcome.
fn passed(d: &mut Dispatcher, worker: WorkerId) -> SchedOutcome {
    let (mut migrated_from, mut overload) = (None, None);
    for e in d.drain_events() {
        match e {
            Event::Overload { worker, slot } => {
                overload = Some(buffet_dispatch::OverloadReport { worker, slot })
            }
            Event::Migration { from, .. } => migrated_from = Some(from),
        }
    }
    SchedOutcome::Pass {
        worker,
        migrated_from,
        overload,
    }
}

impl TraceScheduler for CScheduler {
    fn add_worker(&mut self, max_nb: u64) -> Result<(), EngineError> {
        // The trace runner adds at most 65 535 workers (K is a u16).
        let _ = CScheduler::add_worker(self, max_nb);
        Ok(())
    }

    fn admit(
        &mut self,
        slot: TenantSlot,
        worker: WorkerId,
        max_nb: u64,
    ) -> Result<(), TraceAdmitError> {
        self.add_tenant(slot, worker, max_nb)
            .map_err(|_| TraceAdmitError)
    }

    fn schedule(&mut self, ts_ns: u64, slot: TenantSlot) -> Result<SchedOutcome, EngineError> {
        Ok(CScheduler::schedule(self, ts_ns, slot))
    }
}

/// The XDP dispatcher as a trace engine. The trace names tenants, not frames, so each
/// tenant slot `s` gets one rule, source address `10.0.0.0 + s` (/32), and each packet is
/// a UDP frame from that address: the program's own key extraction, classifier maps,
/// scheduler step and ring buffer decide, at the trace's timestamp (test mode).
#[derive(Debug)]
pub struct XdpTrace {
    d: XdpDispatcher,
    frame: [u8; XDP_TRACE_FRAME_LEN],
}

const XDP_TRACE_FRAME_LEN: usize = 14 + 20 + 8;
/// Where the IPv4 source address sits in the trace frame.
const XDP_TRACE_SRC: usize = 14 + 12;

impl XdpTrace {
    /// Loads the XDP dispatcher in test mode with the trace's scheduler parameters.
    pub fn new(sched: SchedulerConfig) -> Result<XdpTrace, buffet_xdp::LoadError> {
        let d = XdpDispatcher::load(XdpConfig {
            shift: sched.shift,
            threshold: sched.threshold,
            test_mode: true,
            ..XdpConfig::default()
        })?;
        let mut frame = [0u8; XDP_TRACE_FRAME_LEN];
        frame[..12].copy_from_slice(&[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1]);
        frame[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let ip = &mut frame[14..34];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&28u16.to_be_bytes());
        ip[8] = 64;
        ip[9] = 17;
        ip[16..20].copy_from_slice(&[10, 255, 255, 254]);
        let udp = &mut frame[34..42];
        udp[0..2].copy_from_slice(&1024u16.to_be_bytes());
        udp[2..4].copy_from_slice(&1024u16.to_be_bytes());
        udp[4..6].copy_from_slice(&8u16.to_be_bytes());
        Ok(XdpTrace { d, frame })
    }

    fn source_of(slot: TenantSlot) -> [u8; 4] {
        (0x0a00_0000u32 | slot.0).to_be_bytes()
    }
}

impl TraceScheduler for XdpTrace {
    fn add_worker(&mut self, max_nb: u64) -> Result<(), EngineError> {
        self.d.add_worker(max_nb)?;
        Ok(())
    }

    fn admit(
        &mut self,
        slot: TenantSlot,
        worker: WorkerId,
        max_nb: u64,
    ) -> Result<(), TraceAdmitError> {
        // Slots stay below 2^24 (the registry's bound), so 10.0.0.0 + slot is in 10/8.
        let [a, b, c, d] = Self::source_of(slot);
        let rule = Match {
            src_ip: Some(
                IpPrefix::new(IpAddr::V4(Ipv4Addr::new(a, b, c, d)), 32)
                    .map_err(|_| TraceAdmitError)?,
            ),
            ..Match::default()
        };
        self.d
            .admit(slot, &[(0, rule)], max_nb, worker)
            .map_err(|_| TraceAdmitError)
    }

    fn schedule(&mut self, ts_ns: u64, slot: TenantSlot) -> Result<SchedOutcome, EngineError> {
        self.frame[XDP_TRACE_SRC..XDP_TRACE_SRC + 4].copy_from_slice(&Self::source_of(slot));
        let run = self.d.run(ts_ns, &self.frame)?;
        Ok(match run.decision {
            XdpDecision::Pass {
                worker,
                migrated_from,
                overload,
                ..
            } => SchedOutcome::Pass {
                worker,
                migrated_from,
                overload,
            },
            XdpDecision::Policed(_) => SchedOutcome::Policed,
            XdpDecision::NoLiveWorker => SchedOutcome::NoLiveWorker,
            XdpDecision::Unmatched | XdpDecision::Malformed(_) => SchedOutcome::UnknownTenant,
        })
    }
}

/// The trace's fixed setup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceConfig {
    /// Number of workers, K (at least 1).
    pub workers: u16,
    /// Every worker's MAX_NB per slot (taken literally: 0 means always overloaded).
    pub worker_max: u64,
    /// Every tenant's MAX_NB per slot (0: unlimited).
    pub tenant_max: u64,
    /// `slot = ts_ns >> shift`.
    pub shift: u32,
    /// Overload reports while a worker's TIMES exceeds this.
    pub threshold: u32,
    /// The scheduler implementation that runs the trace.
    pub engine: TraceEngine,
}

impl TraceConfig {
    /// The scheduler's part of the setup.
    fn sched(&self) -> SchedulerConfig {
        SchedulerConfig {
            shift: self.shift,
            threshold: self.threshold,
        }
    }
}

/// The Rust engine: a Dispatcher with no tagging and unmatched frames dropped.
fn rust_dispatcher(sched: SchedulerConfig) -> Dispatcher {
    Dispatcher::new(DispatcherConfig {
        sched,
        tag: TagMode::None,
        unmatched: UnmatchedPolicy::Drop,
        ..DispatcherConfig::default()
    })
}

/// Adds the trace's K workers of MAX_NB `cfg.worker_max` through `add` (none is an
/// error).
fn add_workers(
    cfg: &TraceConfig,
    mut add: impl FnMut(u64) -> Result<(), EngineError>,
) -> Result<(), TraceError> {
    if cfg.workers == 0 {
        return Err(TraceError::NoWorkers);
    }
    for _ in 0..cfg.workers {
        add(cfg.worker_max).map_err(|source| TraceError::Engine {
            engine: cfg.engine,
            source,
        })?;
    }
    Ok(())
}

/// Why the XDP engine could not be loaded, as a trace error.
fn xdp_load_error(e: buffet_xdp::LoadError) -> TraceError {
    let engine = TraceEngine::Xdp;
    match e {
        buffet_xdp::LoadError::Unavailable(why) => TraceError::EngineUnavailable { engine, why },
        e => TraceError::Engine {
            engine,
            source: e.into(),
        },
    }
}

/// Totals over a trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceSummary {
    /// Packets read.
    pub packets: u64,
    /// Packets passed.
    pub passed: u64,
    /// Packets dropped (policed).
    pub dropped: u64,
    /// Overload reports written.
    pub overloads: u64,
    /// Tenant migrations.
    pub migrations: u64,
    /// Distinct tenants seen (with `--frames`: the tenants of the tenants file).
    pub tenants: u64,
    /// Frames that did not parse (`--frames` only).
    pub malformed: u64,
    /// Frames no rule matched (`--frames` only).
    pub unmatched: u64,
}

/// What is wrong with one input line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// Not exactly two comma-separated fields.
    #[error("expected `ts_ns,tenant_id`, found {0} field(s)")]
    FieldCount(usize),
    /// The timestamp is not a decimal `u64`.
    #[error("bad ts_ns {0:?} (want a decimal u64)")]
    BadTimestamp(String),
    /// The tenant id is not a decimal `u32`.
    #[error("bad tenant_id {0:?} (want a decimal u32)")]
    BadTenant(String),
    /// The header line after the first packet.
    #[error("header line after the first packet")]
    MisplacedHeader,
    /// More distinct tenants than the dispatcher has slots for.
    #[error("too many distinct tenants")]
    TooManyTenants,
    /// Not exactly two comma-separated fields (`--frames`).
    #[error("expected `ts_ns,hex_frame`, found {0} field(s)")]
    FrameFieldCount(usize),
    /// A character of the frame that is not a hex digit (`at`: 1-based, in the field).
    #[error("hex_frame: {found:?} (hex digit {at}) is not a hex digit")]
    BadHexDigit {
        /// Position in the hex field, from 1.
        at: usize,
        /// The character found.
        found: char,
    },
    /// An odd number of hex digits.
    #[error("hex_frame has an odd number of hex digits ({0})")]
    OddHexDigits(usize),
    /// A frame shorter than an Ethernet header.
    #[error(
        "a {0}-byte frame is shorter than an Ethernet header ({min} bytes)",
        min = frames::MIN_FRAME_LEN
    )]
    FrameTooShort(usize),
    /// A frame longer than [`frames::MAX_FRAME_LEN`].
    #[error("a {0}-byte frame is longer than {max} bytes", max = frames::MAX_FRAME_LEN)]
    FrameTooLong(usize),
}

/// Why a trace run stopped.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// K = 0.
    #[error("the trace needs at least one worker")]
    NoWorkers,
    /// The engine is not part of this build (the XDP program needs clang at build time).
    #[error("{engine} engine unavailable: {why}")]
    EngineUnavailable {
        /// The engine.
        engine: TraceEngine,
        /// Why.
        why: &'static str,
    },
    /// The engine failed (loading, a map write, a test run).
    #[error("{engine} engine: {source}")]
    Engine {
        /// The engine.
        engine: TraceEngine,
        /// What went wrong.
        source: EngineError,
    },
    /// An engine refused a tenant of the tenants file (`--frames`), before the first
    /// frame: a rule it cannot express (`why` names it, `rules[i]: …`) or its capacity.
    #[error("tenant {tenant}: {engine} engine: {why}")]
    Rules {
        /// The tenant's id.
        tenant: u32,
        /// The engine.
        engine: TraceEngine,
        /// Why.
        why: String,
    },
    /// A malformed line.
    #[error("line {line}: {source}")]
    Line {
        /// 1-based line number.
        line: u64,
        /// What is wrong with it.
        source: LineError,
    },
    /// Reading the input failed.
    #[error("reading the trace: {0}")]
    Read(#[source] io::Error),
    /// Writing the output failed.
    #[error("writing the results: {0}")]
    Write(#[source] io::Error),
}

const HEADER: &[u8] = b"ts_ns,tenant_id";

/// Runs the scheduler over `input`, writing decisions to `out` and overload reports to
/// `err` (see the module docs for the formats).
pub fn run_trace(
    input: impl BufRead,
    out: impl Write,
    err: impl Write,
    cfg: &TraceConfig,
) -> Result<TraceSummary, TraceError> {
    if cfg.workers == 0 {
        return Err(TraceError::NoWorkers);
    }
    let sched = cfg.sched();
    match cfg.engine {
        TraceEngine::Rust => run_with(rust_dispatcher(sched), input, out, err, cfg),
        TraceEngine::C => run_with(CScheduler::new(sched), input, out, err, cfg),
        TraceEngine::Xdp => {
            let d = XdpTrace::new(sched).map_err(xdp_load_error)?;
            run_with(d, input, out, err, cfg)
        }
    }
}

/// [`run_trace`] with a given scheduler implementation (fresh: no workers, no tenants).
pub fn run_with(
    mut d: impl TraceScheduler,
    mut input: impl BufRead,
    mut out: impl Write,
    mut err: impl Write,
    cfg: &TraceConfig,
) -> Result<TraceSummary, TraceError> {
    add_workers(cfg, |max| d.add_worker(max))?;
    let engine = cfg.engine;
    let engine_err = |source| TraceError::Engine { engine, source };
    let mut sum = TraceSummary::default();
    let mut buf = Vec::with_capacity(64);
    let mut line_no = 0u64;
    // The trace runner has no Memory Manager, so it owns the tenant registry itself.
    let mut registry = TenantRegistry::new(MAX_TENANT_SLOTS);
    while let Some(line) = next_record(&mut input, &mut buf, &mut line_no, HEADER, sum.packets > 0)?
    {
        let at = |source| TraceError::Line {
            line: line_no,
            source,
        };
        let (ts, tid) = parse_record(line).map_err(at)?;
        let id = TenantId(tid);
        let slot = match registry.slot_of(id) {
            Some(s) => s,
            None => {
                let slot = registry
                    .next_slot(id)
                    .map_err(|_| at(LineError::TooManyTenants))?;
                let worker = WorkerId((tid % u32::from(cfg.workers)) as u16);
                d.admit(slot, worker, cfg.tenant_max)
                    .map_err(|_| at(LineError::TooManyTenants))?;
                registry
                    .admit(slot, id)
                    .map_err(|_| at(LineError::TooManyTenants))?;
                sum.tenants += 1;
                slot
            }
        };
        let seq = sum.packets;
        sum.packets += 1;
        match d.schedule(ts, slot).map_err(engine_err)? {
            SchedOutcome::Pass {
                worker,
                migrated_from,
                overload,
            } => {
                sum.passed += 1;
                writeln!(out, "{seq},{tid},pass,{}", worker.0).map_err(TraceError::Write)?;
                if migrated_from.is_some() {
                    sum.migrations += 1;
                }
                if let Some(r) = overload {
                    sum.overloads += 1;
                    writeln!(err, "overload,{seq},{},{}", r.worker.0, r.slot)
                        .map_err(TraceError::Write)?;
                }
            }
            // Every tenant is admitted on a live worker and workers never stop here, so
            // only policing drops; the other reasons print the same way.
            SchedOutcome::Policed | SchedOutcome::NoLiveWorker | SchedOutcome::UnknownTenant => {
                sum.dropped += 1;
                writeln!(out, "{seq},{tid},drop,").map_err(TraceError::Write)?;
            }
        }
    }
    Ok(sum)
}

/// Reads the next record of a trace into `buf` and returns it trimmed, `None` at the end
/// of the input. Blank lines, `#` comments and the `header` line are skipped; the header
/// after the first record (`started`) is an error. `line_no` counts the lines read.
fn next_record<'b>(
    input: &mut impl BufRead,
    buf: &'b mut Vec<u8>,
    line_no: &mut u64,
    header: &[u8],
    started: bool,
) -> Result<Option<&'b [u8]>, TraceError> {
    loop {
        buf.clear();
        if input.read_until(b'\n', buf).map_err(TraceError::Read)? == 0 {
            return Ok(None);
        }
        *line_no += 1;
        let line = trim(buf);
        if line.is_empty() || line[0] == b'#' {
            continue;
        }
        if !fields_eq(line, header) {
            break;
        }
        if started {
            return Err(TraceError::Line {
                line: *line_no,
                source: LineError::MisplacedHeader,
            });
        }
    }
    Ok(Some(trim(buf)))
}

/// Strips surrounding spaces, tabs, `\r` and `\n`.
fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t' | b'\r' | b'\n', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t' | b'\r' | b'\n'] = s {
        s = rest;
    }
    s
}

/// Whether `line`'s comma-separated fields, trimmed, are `header`'s.
fn fields_eq(line: &[u8], header: &[u8]) -> bool {
    let mut it = line.split(|&b| b == b',').map(trim);
    let mut h = header.split(|&b| b == b',');
    loop {
        match (it.next(), h.next()) {
            (None, None) => return true,
            (Some(a), Some(b)) if a == b => {}
            _ => return false,
        }
    }
}

fn parse_record(line: &[u8]) -> Result<(u64, u32), LineError> {
    let mut fields = line.split(|&b| b == b',');
    let (Some(ts), Some(tid), None) = (fields.next(), fields.next(), fields.next()) else {
        return Err(LineError::FieldCount(line.split(|&b| b == b',').count()));
    };
    let (ts, tid) = (trim(ts), trim(tid));
    let ts = decimal(ts)
        .ok_or_else(|| LineError::BadTimestamp(String::from_utf8_lossy(ts).into_owned()))?;
    let tid = decimal(tid)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| LineError::BadTenant(String::from_utf8_lossy(tid).into_owned()))?;
    Ok((ts, tid))
}

/// A non-empty run of ASCII digits that fits a `u64`.
fn decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0u64, |acc, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(workers: u16, worker_max: u64, tenant_max: u64, threshold: u32) -> TraceConfig {
        TraceConfig {
            workers,
            worker_max,
            tenant_max,
            shift: 0,
            threshold,
            engine: TraceEngine::Rust,
        }
    }

    fn run_engine(
        input: &[u8],
        c: &TraceConfig,
    ) -> Result<(String, String, TraceSummary), TraceError> {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let s = run_trace(input, &mut out, &mut err, c)?;
        Ok((
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
            s,
        ))
    }

    /// Runs `c.engine` (the Rust engine in these tests) and checks that the C engine
    /// gives the same result, error included.
    fn run(input: &[u8], c: &TraceConfig) -> Result<(String, String, TraceSummary), TraceError> {
        let want = run_engine(input, c);
        let got = run_engine(
            input,
            &TraceConfig {
                engine: TraceEngine::C,
                ..*c
            },
        );
        match (&want, &got) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "c engine"),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "c engine"),
            _ => panic!("engines disagree: {want:?} vs {got:?}"),
        }
        want
    }

    /// K = 2, worker MAX_NB 4, tenant MAX_NB 2, shift 0 (slot = ts), threshold 0.
    /// Tenants: 4 and 10 start on w0 (even), 7 on w1.
    #[test]
    fn hand_computed_vector() {
        let input = b"ts_ns,tenant_id\n\
# slot 0\n\
0,4\n\
0,4\n\
0,4\n\
0,10\n\
\n\
0,10\n\
0,7\r\n\
1,4\n\
 1 , 10 \n\
1,7\n\
1,10\n\
1,10\n\
3,4";
        let want_out = "\
0,4,pass,0
1,4,pass,0
2,4,drop,
3,10,pass,0
4,10,pass,0
5,7,pass,1
6,4,pass,0
7,10,pass,1
8,7,pass,1
9,10,pass,1
10,10,drop,
11,4,pass,0
";
        // seq 0-1: tenant 4 new on w0 (last 0 < 4); pkt 1, 2. seq 2: pkt 3 > 2, drop.
        // seq 3-4: tenant 10 on w0: w0.pkt 4. seq 5: tenant 7 on w1: w1.pkt 1.
        // seq 6 (slot 1): tenant 4 tmp 3 (policed included); w0.last 4 >= 4 ->
        //   overload; w1.last 1 is lowest; 1 + 3 < 4 fails -> stays; times 1 > 0 ->
        //   report (w0, 1).
        // seq 7: tenant 10 tmp 2; overload again; 1 + 2 < 4 -> migrates to w1 (w0.last
        //   2, w1.last 3); times 2 -> report (w0, 1); the packet goes to w1.
        // seq 8: tenant 7 tmp 1; w1.last 3 < 4 -> pass w1. seq 9: tenant 10 pkt 2 on w1;
        //   seq 10: pkt 3 > 2, drop.
        // seq 11 (slot 3): tenant 4 idle in slot 2 -> tmp 0; w0 idle in 2 -> last 0 < 4.
        let want_err = "overload,6,0,1\noverload,7,0,1\n";
        let (out, err, s) = run(input, &cfg(2, 4, 2, 0)).unwrap();
        assert_eq!(out, want_out);
        assert_eq!(err, want_err);
        assert_eq!(
            s,
            TraceSummary {
                packets: 12,
                passed: 10,
                dropped: 2,
                overloads: 2,
                migrations: 1,
                tenants: 3,
                ..TraceSummary::default()
            }
        );
    }

    #[test]
    fn ids_are_arbitrary_u32_mapped_in_order_of_appearance() {
        let input = b"5,4294967295\n5,0\n5,3000000000\n";
        // K = 3: 4294967295 % 3 = 0, 0 % 3 = 0, 3000000000 % 3 = 0.
        let (out, _, s) = run(input, &cfg(3, 100, 0, 3)).unwrap();
        assert_eq!(
            out,
            "0,4294967295,pass,0\n1,0,pass,0\n2,3000000000,pass,0\n"
        );
        assert_eq!(s.tenants, 3);
        let (out, _, _) = run(b"0,5\n0,6\n0,7\n", &cfg(3, 100, 0, 3)).unwrap();
        assert_eq!(out, "0,5,pass,2\n1,6,pass,0\n2,7,pass,1\n");
    }

    #[test]
    fn empty_and_comment_only_inputs() {
        let (out, err, s) = run(b"", &cfg(1, 1, 0, 0)).unwrap();
        assert_eq!((out.as_str(), err.as_str(), s.packets), ("", "", 0));
        let (out, _, s) = run(b"# nothing\n\n  \nts_ns,tenant_id\n", &cfg(1, 1, 0, 0)).unwrap();
        assert_eq!((out.as_str(), s.packets), ("", 0));
    }

    #[test]
    fn malformed_lines_name_their_line() {
        let cases: &[(&[u8], u64, LineError)] = &[
            (b"0,1\n1,2,3\n", 2, LineError::FieldCount(3)),
            (b"0\n", 1, LineError::FieldCount(1)),
            (b"x,1\n", 1, LineError::BadTimestamp("x".into())),
            (b"-1,1\n", 1, LineError::BadTimestamp("-1".into())),
            (b"+1,1\n", 1, LineError::BadTimestamp("+1".into())),
            (b",1\n", 1, LineError::BadTimestamp(String::new())),
            (
                b"18446744073709551616,1\n",
                1,
                LineError::BadTimestamp("18446744073709551616".into()),
            ),
            (b"# c\n\n1,\n", 3, LineError::BadTenant(String::new())),
            (
                b"1,4294967296\n",
                1,
                LineError::BadTenant("4294967296".into()),
            ),
            (b"1,1x\n", 1, LineError::BadTenant("1x".into())),
            (b"1,\xff\n", 1, LineError::BadTenant("\u{fffd}".into())),
            (b"1,2\nts_ns,tenant_id\n", 2, LineError::MisplacedHeader),
            (b"1 2,3\n", 1, LineError::BadTimestamp("1 2".into())),
        ];
        for (input, line, why) in cases {
            match run(input, &cfg(2, 10, 0, 3)) {
                Err(TraceError::Line { line: l, source }) => {
                    assert_eq!(
                        (l, &source),
                        (*line, why),
                        "{:?}",
                        String::from_utf8_lossy(input)
                    );
                }
                other => panic!("{:?}: {other:?}", String::from_utf8_lossy(input)),
            }
        }
        let e = run(b"0,1\nbad\n", &cfg(1, 1, 0, 0)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 2: expected `ts_ns,tenant_id`, found 1 field(s)"
        );
        assert!(matches!(
            run(b"0,1\n", &cfg(0, 1, 0, 0)),
            Err(TraceError::NoWorkers)
        ));
    }

    #[test]
    fn write_errors_are_reported() {
        struct Broken;
        impl Write for Broken {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::Error::other("disk full"))
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        for engine in [TraceEngine::Rust, TraceEngine::C] {
            let c = TraceConfig {
                engine,
                ..cfg(1, 1, 0, 0)
            };
            let e = run_trace(&b"0,1\n"[..], Broken, io::sink(), &c).unwrap_err();
            assert!(matches!(e, TraceError::Write(_)), "{engine}: {e:?}");
        }
    }

    /// The xdp engine prints what the rust engine prints, or, where it cannot run (no
    /// clang at build time, no CAP_BPF), stops before the first packet saying why.
    /// tests/trace.rs requires it to run under BUFFET_REQUIRE_PRIVILEGED=1.
    #[test]
    fn xdp_engine_matches_rust_or_says_why() {
        let input = b"0,4\n0,4\n0,4\n0,10\n0,10\n0,7\n1,4\n1,10\n1,7\n1,10\n1,10\n3,4\n";
        let c = cfg(2, 4, 2, 0);
        let want = run_engine(input, &c).unwrap();
        let xdp = TraceConfig {
            engine: TraceEngine::Xdp,
            ..c
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        match run_trace(&input[..], &mut out, &mut err, &xdp) {
            Ok(s) => {
                let got = (
                    String::from_utf8(out).unwrap(),
                    String::from_utf8(err).unwrap(),
                    s,
                );
                assert_eq!(got, want);
            }
            Err(e) => {
                assert!(
                    matches!(
                        e,
                        TraceError::EngineUnavailable {
                            engine: TraceEngine::Xdp,
                            ..
                        } | TraceError::Engine {
                            engine: TraceEngine::Xdp,
                            ..
                        }
                    ),
                    "{e:?}"
                );
                assert!(e.to_string().starts_with("xdp engine"), "{e}");
                assert!(out.is_empty() && err.is_empty());
            }
        }
    }

    #[test]
    fn default_shift_uses_nanoseconds() {
        let c = TraceConfig {
            shift: 30,
            ..cfg(1, 1, 1, 3)
        };
        // 0 and 2^30 - 1 share slot 0 (second is policed); 2^30 is slot 1.
        let (out, _, _) = run(b"0,9\n1073741823,9\n1073741824,9\n", &c).unwrap();
        assert_eq!(out, "0,9,pass,0\n1,9,drop,\n2,9,pass,0\n");
    }
}
