//! `buffet trace --frames`: the classifier and the scheduler together, over a trace of
//! whole Ethernet frames.
//!
//! Input, one frame per line: `ts_ns,hex_frame`: a decimal `u64` timestamp and the whole
//! Ethernet frame as hex digits (upper or lower case, two per byte, nothing between
//! them; spaces or tabs around a field are ignored, as is a trailing `\r`). Blank lines
//! and lines whose first non-blank character is `#` are skipped, and so is one header
//! line `ts_ns,hex_frame` before the first frame. A frame has
//! [`MIN_FRAME_LEN`]..=[`MAX_FRAME_LEN`] bytes (an Ethernet header at least — no NIC
//! delivers less, and the XDP test run takes no less — and at most a 1500-byte payload
//! with one VLAN tag). Anything else is an error naming its (1-based) line, and
//! processing stops there.
//!
//! The tenants come from a tenants file ([`crate::tenants`]): they get tenant slots in
//! file order, each on worker `tenant_id % K`, with MAX_NB the tenant's `max_nb`, or, when
//! that is 0, [`TraceConfig::tenant_max`](super::TraceConfig::tenant_max) (0: unlimited).
//! Every engine takes every tenant with all its rules before the first frame; an engine
//! that cannot express a rule stops the run there with [`TraceError::Rules`] naming the
//! tenant and the rule. Every frame arrives on in_port 0.
//!
//! Each engine classifies and schedules each frame itself:
//!
//! * `rust`: buffet-dispatch's [`Dispatcher::dispatch`] (its parse, classifier and
//!   scheduler step);
//! * `c`: the C core's key extraction ([`buffet_nicfw::extract_key`]), the Rust
//!   [`Classifier`] on the fields it extracted ([`Classifier::lookup_fields`]), and the C
//!   scheduler step ([`CScheduler`]). The C core extracts no SCTP ports (the XDP program
//!   reads them itself), so this engine refuses a rule with ports that could match SCTP
//!   (protocol `sctp`, or ports with no protocol) before the first frame, and does not
//!   see a truncated SCTP header as malformed;
//! * `xdp`: the XDP program in the kernel ([`XdpDispatcher::run`] in test mode, the
//!   trace's timestamp injected): its own key extraction, classifier maps and scheduler
//!   step. Rules its maps cannot hold are refused as above.
//!
//! Output, to `out`, one line per frame, `seq` counting frames from 0:
//! `seq,tenant_id,pass,worker`, `seq,tenant_id,drop,` (policed), `seq,,unmatched,` (no
//! rule matched) or `seq,,malformed,` (the frame did not parse). To `err`, one line per
//! overload report, `overload,seq,worker,slot`, as in the `ts_ns,tenant_id` mode.
//!
//! The runner reuses one frame buffer: it allocates nothing per frame (the `xdp` engine's
//! test runs do, in buffet-xdp).

use std::io::{BufRead, Write};

use buffet_dispatch::scheduler::SchedOutcome;
use buffet_dispatch::{
    Classifier, Decision, DispatchDrop, DispatchError, Dispatcher, Match, PacketFields, Rule,
    SchedulerConfig, TenantSlot, WorkerId,
};
use buffet_nicfw::CScheduler;
use buffet_xdp::{XdpConfig, XdpDecision, XdpDispatcher};

use super::{
    add_workers, rust_dispatcher, trim, xdp_load_error, EngineError, LineError, TraceConfig,
    TraceEngine, TraceError, TraceSummary,
};
use crate::tenants::TenantConfig;

/// The shortest frame a line may carry: an Ethernet header.
pub const MIN_FRAME_LEN: usize = 14;
/// The longest frame a line may carry: 1500 bytes of payload, one VLAN tag.
pub const MAX_FRAME_LEN: usize = 1518;

const HEADER: &[u8] = b"ts_ns,hex_frame";

/// What an engine made of one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameOutcome {
    /// The frame did not parse.
    Malformed,
    /// No rule matched.
    Unmatched,
    /// Classified to this tenant slot; the scheduler step's outcome.
    Tenant(TenantSlot, SchedOutcome),
}

/// What the frame-trace runner needs from an engine: workers, tenants with their rules,
/// and one classify-and-schedule step per frame.
pub trait FrameEngine {
    /// Adds a live worker with MAX_NB `max_nb`.
    fn add_worker(&mut self, max_nb: u64) -> Result<(), EngineError>;
    /// Admits tenant `slot` on `worker` with MAX_NB `max_nb` and its classifier `rules`
    /// (`(priority, match)`, in the tenants file's order). On refusal, why, naming the
    /// rule (`rules[i]: …`) when a rule is the reason.
    fn admit(
        &mut self,
        slot: TenantSlot,
        worker: WorkerId,
        rules: &[(u32, Match)],
        max_nb: u64,
    ) -> Result<(), String>;
    /// Classifies and schedules one frame arriving at `ts_ns` (on in_port 0).
    fn step(&mut self, ts_ns: u64, frame: &mut [u8]) -> Result<FrameOutcome, EngineError>;
}

/// The `rust` engine: buffet-dispatch's Dispatcher.
#[derive(Debug)]
pub struct RustFrames(Dispatcher);

impl RustFrames {
    /// A Dispatcher with no tagging and unmatched frames dropped.
    pub fn new(sched: SchedulerConfig) -> RustFrames {
        RustFrames(rust_dispatcher(sched))
    }
}

impl FrameEngine for RustFrames {
    fn add_worker(&mut self, max_nb: u64) -> Result<(), EngineError> {
        self.0.add_worker(max_nb);
        Ok(())
    }

    fn admit(
        &mut self,
        slot: TenantSlot,
        worker: WorkerId,
        rules: &[(u32, Match)],
        max_nb: u64,
    ) -> Result<(), String> {
        self.0
            .admit_on(slot, rules.to_vec(), max_nb, worker)
            .map(drop)
            .map_err(|e| match e {
                DispatchError::InvalidRule { index, source } => format!("rules[{index}]: {source}"),
                e => e.to_string(),
            })
    }

    fn step(&mut self, ts_ns: u64, frame: &mut [u8]) -> Result<FrameOutcome, EngineError> {
        Ok(match self.0.dispatch(ts_ns, 0, frame) {
            Decision::Pass { worker, tenant } => {
                FrameOutcome::Tenant(tenant, super::passed(&mut self.0, worker))
            }
            Decision::Drop(DispatchDrop::Malformed(_)) => FrameOutcome::Malformed,
            Decision::Drop(DispatchDrop::Unmatched) => FrameOutcome::Unmatched,
            Decision::Drop(DispatchDrop::Policed(s)) => {
                FrameOutcome::Tenant(s, SchedOutcome::Policed)
            }
            // Workers never stop in a trace, so this cannot happen; it would print as
            // a drop of no tenant.
            Decision::Drop(DispatchDrop::NoLiveWorker) => {
                FrameOutcome::Tenant(TenantSlot(u32::MAX), SchedOutcome::NoLiveWorker)
            }
        })
    }
}

/// The `c` engine: the C core's key extraction, the Rust classifier on its fields, the C
/// scheduler step.
#[derive(Debug)]
pub struct CFrames {
    classifier: Classifier,
    sched: CScheduler,
}

impl CFrames {
    /// An empty classifier and C scheduler.
    pub fn new(sched: SchedulerConfig) -> CFrames {
        CFrames {
            classifier: Classifier::new(),
            sched: CScheduler::new(sched),
        }
    }
}

impl FrameEngine for CFrames {
    fn add_worker(&mut self, max_nb: u64) -> Result<(), EngineError> {
        // The runner adds at most 65 535 workers (K is a u16).
        let _ = self.sched.add_worker(max_nb);
        Ok(())
    }

    fn admit(
        &mut self,
        slot: TenantSlot,
        worker: WorkerId,
        rules: &[(u32, Match)],
        max_nb: u64,
    ) -> Result<(), String> {
        for (index, (_, m)) in rules.iter().enumerate() {
            m.validate().map_err(|e| format!("rules[{index}]: {e}"))?;
            let ports = m.src_port.is_some() || m.dst_port.is_some();
            if ports && matches!(m.protocol, None | Some(132)) {
                return Err(format!(
                    "rules[{index}]: the c engine cannot express it: ports that can match \
                     SCTP, and the C core extracts no SCTP ports"
                ));
            }
        }
        self.sched
            .add_tenant(slot, worker, max_nb)
            .map_err(|e| e.to_string())?;
        for (priority, fields) in rules {
            // Validated above: cannot fail.
            self.classifier
                .insert(Rule {
                    priority: *priority,
                    tenant: slot,
                    fields: fields.clone(),
                })
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn step(&mut self, ts_ns: u64, frame: &mut [u8]) -> Result<FrameOutcome, EngineError> {
        let Ok(k) = buffet_nicfw::extract_key(frame, 0) else {
            return Ok(FrameOutcome::Malformed);
        };
        let fields = PacketFields {
            in_port: k.in_port,
            src_mac: k.src_mac,
            dst_mac: k.dst_mac,
            vlan: k.vlan,
            is_v6: k.is_v6,
            proto: k.proto,
            dscp: k.dscp,
            ports: k.ports,
            src_addr: k.src_addr,
            dst_addr: k.dst_addr,
        };
        Ok(match self.classifier.lookup_fields(&fields) {
            None => FrameOutcome::Unmatched,
            Some(slot) => FrameOutcome::Tenant(slot, self.sched.schedule(ts_ns, slot)),
        })
    }
}

/// The `xdp` engine: the XDP program in the kernel, in test mode.
#[derive(Debug)]
pub struct XdpFrames(XdpDispatcher);

impl XdpFrames {
    /// Loads the XDP dispatcher in test mode with the trace's scheduler parameters.
    pub fn new(sched: SchedulerConfig) -> Result<XdpFrames, buffet_xdp::LoadError> {
        Ok(XdpFrames(XdpDispatcher::load(XdpConfig {
            shift: sched.shift,
            threshold: sched.threshold,
            test_mode: true,
            in_port: 0,
            ..XdpConfig::default()
        })?))
    }
}

impl FrameEngine for XdpFrames {
    fn add_worker(&mut self, max_nb: u64) -> Result<(), EngineError> {
        self.0.add_worker(max_nb)?;
        Ok(())
    }

    fn admit(
        &mut self,
        slot: TenantSlot,
        worker: WorkerId,
        rules: &[(u32, Match)],
        max_nb: u64,
    ) -> Result<(), String> {
        // The dry run names the rule; admission then refuses only for the slot or a map.
        self.0.check_rules(rules).map_err(|e| e.to_string())?;
        self.0
            .admit(slot, rules, max_nb, worker)
            .map_err(|e| e.to_string())
    }

    fn step(&mut self, ts_ns: u64, frame: &mut [u8]) -> Result<FrameOutcome, EngineError> {
        let run = self.0.run(ts_ns, frame)?;
        Ok(match run.decision {
            XdpDecision::Pass {
                worker,
                tenant,
                migrated_from,
                overload,
            } => {
                if migrated_from.is_some() || overload.is_some() {
                    // Reported here; the dispatcher's own queue of them is not needed.
                    let _ = self.0.drain_events();
                }
                FrameOutcome::Tenant(
                    tenant,
                    SchedOutcome::Pass {
                        worker,
                        migrated_from,
                        overload,
                    },
                )
            }
            XdpDecision::Malformed(_) => FrameOutcome::Malformed,
            XdpDecision::Unmatched => FrameOutcome::Unmatched,
            XdpDecision::Policed(s) => FrameOutcome::Tenant(s, SchedOutcome::Policed),
            XdpDecision::NoLiveWorker => {
                FrameOutcome::Tenant(TenantSlot(u32::MAX), SchedOutcome::NoLiveWorker)
            }
        })
    }
}

/// Runs the classifier and the scheduler of `cfg.engine` over the frames of `input`,
/// with `tenants`, writing decisions to `out` and overload reports to `err` (see the
/// module docs for the formats).
pub fn run_frame_trace(
    input: impl BufRead,
    tenants: &[TenantConfig],
    out: impl Write,
    err: impl Write,
    cfg: &TraceConfig,
) -> Result<TraceSummary, TraceError> {
    if cfg.workers == 0 {
        return Err(TraceError::NoWorkers);
    }
    let sched = cfg.sched();
    match cfg.engine {
        TraceEngine::Rust => run_frames_with(RustFrames::new(sched), tenants, input, out, err, cfg),
        TraceEngine::C => run_frames_with(CFrames::new(sched), tenants, input, out, err, cfg),
        TraceEngine::Xdp => {
            let d = XdpFrames::new(sched).map_err(xdp_load_error)?;
            run_frames_with(d, tenants, input, out, err, cfg)
        }
    }
}

/// [`run_frame_trace`] with a given engine (fresh: no workers, no tenants).
pub fn run_frames_with(
    mut d: impl FrameEngine,
    tenants: &[TenantConfig],
    mut input: impl BufRead,
    mut out: impl Write,
    mut err: impl Write,
    cfg: &TraceConfig,
) -> Result<TraceSummary, TraceError> {
    add_workers(cfg, |max| d.add_worker(max))?;
    let engine = cfg.engine;
    let engine_err = |source| TraceError::Engine { engine, source };
    // Slot i holds the i-th tenant of the file.
    let mut ids = Vec::with_capacity(tenants.len());
    for (i, t) in tenants.iter().enumerate() {
        let refused = |why: String| TraceError::Rules {
            tenant: t.id.0,
            engine,
            why,
        };
        let slot = TenantSlot(u32::try_from(i).map_err(|_| refused("too many tenants".into()))?);
        let worker = WorkerId((t.id.0 % u32::from(cfg.workers)) as u16);
        let max_nb = if t.max_nb != 0 {
            t.max_nb
        } else {
            cfg.tenant_max
        };
        d.admit(slot, worker, &t.rules, max_nb).map_err(refused)?;
        ids.push(t.id.0);
    }
    let mut sum = TraceSummary {
        tenants: ids.len() as u64,
        ..TraceSummary::default()
    };
    let mut buf = Vec::with_capacity(2 * MAX_FRAME_LEN + 32);
    let mut frame = Vec::with_capacity(MAX_FRAME_LEN);
    let mut line_no = 0u64;
    while let Some(line) =
        super::next_record(&mut input, &mut buf, &mut line_no, HEADER, sum.packets > 0)?
    {
        let at = |source| TraceError::Line {
            line: line_no,
            source,
        };
        let ts = parse_frame_record(line, &mut frame).map_err(at)?;
        let seq = sum.packets;
        sum.packets += 1;
        let tenant_id = |slot: TenantSlot| ids.get(slot.index()).copied();
        match d.step(ts, &mut frame).map_err(engine_err)? {
            FrameOutcome::Malformed => {
                sum.malformed += 1;
                writeln!(out, "{seq},,malformed,").map_err(TraceError::Write)?;
            }
            FrameOutcome::Unmatched | FrameOutcome::Tenant(_, SchedOutcome::UnknownTenant) => {
                sum.unmatched += 1;
                writeln!(out, "{seq},,unmatched,").map_err(TraceError::Write)?;
            }
            FrameOutcome::Tenant(
                slot,
                SchedOutcome::Pass {
                    worker,
                    migrated_from,
                    overload,
                },
            ) => {
                sum.passed += 1;
                let tid = tenant_id(slot).unwrap_or(u32::MAX);
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
            FrameOutcome::Tenant(slot, SchedOutcome::Policed | SchedOutcome::NoLiveWorker) => {
                sum.dropped += 1;
                match tenant_id(slot) {
                    Some(tid) => writeln!(out, "{seq},{tid},drop,"),
                    None => writeln!(out, "{seq},,drop,"),
                }
                .map_err(TraceError::Write)?;
            }
        }
    }
    Ok(sum)
}

/// Parses `ts_ns,hex_frame` into the timestamp, and the frame into `frame` (cleared
/// first).
pub fn parse_frame_record(line: &[u8], frame: &mut Vec<u8>) -> Result<u64, LineError> {
    let mut fields = line.split(|&b| b == b',');
    let (Some(ts), Some(hex), None) = (fields.next(), fields.next(), fields.next()) else {
        return Err(LineError::FrameFieldCount(
            line.split(|&b| b == b',').count(),
        ));
    };
    let (ts, hex) = (trim(ts), trim(hex));
    let ts = super::decimal(ts)
        .ok_or_else(|| LineError::BadTimestamp(String::from_utf8_lossy(ts).into_owned()))?;
    frame.clear();
    if let Some(i) = hex.iter().position(|&b| hex_value(b).is_none()) {
        return Err(LineError::BadHexDigit {
            at: i + 1,
            found: char::from(hex[i]),
        });
    }
    if hex.len() % 2 != 0 {
        return Err(LineError::OddHexDigits(hex.len()));
    }
    let len = hex.len() / 2;
    if len < MIN_FRAME_LEN {
        return Err(LineError::FrameTooShort(len));
    }
    if len > MAX_FRAME_LEN {
        return Err(LineError::FrameTooLong(len));
    }
    frame.extend(
        hex.chunks_exact(2)
            .map(|p| hex_value(p[0]).unwrap_or(0) << 4 | hex_value(p[1]).unwrap_or(0)),
    );
    Ok(ts)
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn cfg(engine: TraceEngine) -> TraceConfig {
        TraceConfig {
            workers: 2,
            worker_max: 100,
            tenant_max: 0,
            shift: 0,
            threshold: 3,
            engine,
        }
    }

    fn tenants() -> Vec<TenantConfig> {
        crate::tenants::parse(
            crate::tenants::Format::Toml,
            Path::new("t.toml"),
            "[[tenant]]\nid = 7\nrules = [ { dst_ip = \"10.7.0.0/16\" } ]\n\
             [[tenant]]\nid = 4\nmax_nb = 1\nrules = [ { protocol = \"udp\", dst_port = 53 } ]\n",
        )
        .unwrap()
    }

    /// An IPv4/UDP frame from 10.0.0.1 to `dst`, destination port `dport`, as hex.
    fn udp4(dst: [u8; 4], dport: u16) -> String {
        let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
        f.extend([0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1]);
        f.extend(dst);
        f.extend(1000u16.to_be_bytes());
        f.extend(dport.to_be_bytes());
        f.extend([0, 8, 0, 0]);
        f.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn run(input: &str, engine: TraceEngine) -> Result<(String, String, TraceSummary), TraceError> {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let s = run_frame_trace(
            input.as_bytes(),
            &tenants(),
            &mut out,
            &mut err,
            &cfg(engine),
        )?;
        Ok((
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
            s,
        ))
    }

    #[test]
    fn classifies_then_schedules_on_rust_and_c() {
        let input = format!(
            "ts_ns,hex_frame\n# to 7\n0,{}\n0,{}\n0,{}\n0,{}\n0,{}\n",
            udp4([10, 7, 1, 1], 9),
            udp4([10, 8, 0, 1], 53),
            udp4([10, 8, 0, 1], 53),
            udp4([10, 8, 0, 1], 54),
            &udp4([10, 8, 0, 1], 54)[..40],
        );
        let want = "0,7,pass,1\n1,4,pass,0\n2,4,drop,\n3,,unmatched,\n4,,malformed,\n";
        for engine in [TraceEngine::Rust, TraceEngine::C] {
            let (out, err, s) = run(&input, engine).unwrap();
            assert_eq!((out.as_str(), err.as_str()), (want, ""), "{engine}");
            assert_eq!(
                s,
                TraceSummary {
                    packets: 5,
                    passed: 2,
                    dropped: 1,
                    unmatched: 1,
                    malformed: 1,
                    tenants: 2,
                    ..TraceSummary::default()
                },
                "{engine}"
            );
        }
    }

    #[test]
    fn bad_frame_lines_name_their_line() {
        let good = udp4([10, 7, 0, 1], 1);
        let cases: Vec<(String, u64, LineError)> = vec![
            (format!("0,{good}\n1\n"), 2, LineError::FrameFieldCount(1)),
            (format!("0,{good},x\n"), 1, LineError::FrameFieldCount(3)),
            (
                format!("x,{good}\n"),
                1,
                LineError::BadTimestamp("x".into()),
            ),
            (
                format!("-1,{good}\n"),
                1,
                LineError::BadTimestamp("-1".into()),
            ),
            ("0,\n".into(), 1, LineError::FrameTooShort(0)),
            ("# c\n\n0,abc\n".into(), 3, LineError::OddHexDigits(3)),
            (
                format!("0,{}\n", &good[..26]),
                1,
                LineError::FrameTooShort(13),
            ),
            (
                format!("0,{}\n", "00".repeat(MAX_FRAME_LEN + 1)),
                1,
                LineError::FrameTooLong(MAX_FRAME_LEN + 1),
            ),
            (
                format!("0,{}zz\n", &good[..30]),
                1,
                LineError::BadHexDigit { at: 31, found: 'z' },
            ),
            (
                format!("0,{} {}\n", &good[..30], &good[30..]),
                1,
                LineError::BadHexDigit { at: 31, found: ' ' },
            ),
            (
                "0,0123456789abcdefABCDEF0g\n".into(),
                1,
                LineError::BadHexDigit { at: 24, found: 'g' },
            ),
            (
                format!("0,{good}\nts_ns,hex_frame\n"),
                2,
                LineError::MisplacedHeader,
            ),
        ];
        for (input, line, why) in cases {
            for engine in [TraceEngine::Rust, TraceEngine::C] {
                match run(&input, engine) {
                    Err(TraceError::Line { line: l, source }) => {
                        assert_eq!((l, &source), (line, &why), "{input:?}");
                    }
                    other => panic!("{input:?}: {other:?}"),
                }
            }
        }
        let e = run("0,00\n", TraceEngine::Rust).unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 1: a 1-byte frame is shorter than an Ethernet header (14 bytes)"
        );
        let e = run(&format!("0,{}0g\n", &good[..28]), TraceEngine::Rust).unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 1: hex_frame: 'g' (hex digit 30) is not a hex digit"
        );
        let e = run("0\n", TraceEngine::Rust).unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 1: expected `ts_ns,hex_frame`, found 1 field(s)"
        );
    }

    #[test]
    fn rules_an_engine_cannot_express_stop_before_the_first_frame() {
        let t = crate::tenants::parse(
            crate::tenants::Format::Toml,
            Path::new("t.toml"),
            "[[tenant]]\nid = 3\nrules = [ { dst_ip = \"10.0.0.0/8\" }, \
             { protocol = \"sctp\", dst_port = 9 } ]\n",
        )
        .unwrap();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let e = run_frame_trace(
            format!("0,{}\n", udp4([10, 0, 0, 1], 9)).as_bytes(),
            &t,
            &mut out,
            &mut err,
            &cfg(TraceEngine::C),
        )
        .unwrap_err();
        assert!(matches!(e, TraceError::Rules { tenant: 3, .. }), "{e:?}");
        assert!(
            e.to_string().starts_with("tenant 3: c engine: rules[1]: "),
            "{e}"
        );
        assert!(out.is_empty() && err.is_empty());
        // The rust engine takes it.
        run_frame_trace(&b""[..], &t, &mut out, &mut err, &cfg(TraceEngine::Rust)).unwrap();
    }
}
