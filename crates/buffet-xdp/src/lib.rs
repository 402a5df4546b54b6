//! The XDP Packet Dispatcher's loader: nic-firmware/xdp/dispatcher.bpf.c, compiled by
//! this crate's build.rs with `clang -target bpf`, loaded with aya.
//!
//! What it does: [`XdpDispatcher`] loads the program and its maps, mirrors the Worker
//! Table, the Tenant Table and the classifier rules into them (rules expand exactly as
//! buffet-dispatch's [`Classifier`](buffet_dispatch::Classifier) expands them, through
//! [`Match::key_pairs`]), and either replays frames through the program with
//! BPF_PROG_TEST_RUN and an injected timestamp ([`XdpDispatcher::run`], test mode: what
//! `buffet trace --engine xdp` and the equivalence tests use) or attaches it to an
//! interface ([`XdpDispatcher::attach`]). Migrations and overload reports come back
//! through the program's BPF ring buffer ([`XdpDispatcher::drain_events`]).
//!
//! Rule changes (admission, removal, [`XdpDispatcher::replace_rules`]) reach the program
//! in one step: the program holds its classifier in two rule banks and classifies each
//! packet against the active one; a change is written into the other bank, which then
//! becomes active with one store, and the old bank is brought up to date once no
//! program run holds it. Every packet is classified entirely under the rules before a
//! change or entirely under the rules after it. The Rust model of the rules (the best
//! entry per (tuple, masked key)) is the one source of what either bank holds.
//!
//! Frames go to the chosen worker's AF_XDP socket on the frame's own receive queue: the
//! kernel delivers an XSKMAP redirect only to a socket bound to the frame's (interface,
//! queue), so a worker has one socket per queue it serves, and the program redirects to
//! key `rx_queue_index * XSK_STRIDE + worker` ([`xsk_key`]; [`MAX_QUEUES`] queues of
//! [`XSK_STRIDE`] keys). [`XdpDispatcher::set_worker_socket`] puts a worker's socket of one
//! queue there, [`XdpDispatcher::clear_worker_socket`] takes all of a worker's out. A
//! frame on a queue where its worker has no socket (or beyond [`MAX_QUEUES`]) is dropped
//! (`XDP_DROP`), never handed to the host stack past its tenant's NF, and counted both as
//! passed (the scheduler passed it: the redirect key is no scheduling decision, and test
//! mode never redirects) and as `no_socket` ([`XdpStats::no_socket`]).
//!
//! What it does not do: open AF_XDP sockets (the program's XSKMAP is exposed for them),
//! tenant placement or worker evacuation. For the nfp offload
//! (nic-firmware/xdp/dispatcher_offload.bpf.c, which has no clock), the slot-boundary
//! rebalancing runs on the host: [`offload::OffloadPlanner`].
//!
//! Limits (refused at admission with an error naming the tenant and rule):
//! [`MAX_TENANTS`] tenant slots, [`MAX_WORKERS`] workers, [`MAX_TUPLES`] distinct masks
//! over all rules, [`MAX_RULE_ENTRIES`] (mask, value) entries; and receive queues 0 to
//! [`MAX_QUEUES`]` - 1` for sockets ([`check_queues`], [`SocketError`]).
//!
//! When this crate was built without clang or the libbpf headers, loading fails with
//! [`LoadError::Unavailable`], which names what was missing and how to rebuild ("xdp
//! engine unavailable: clang not found when buffet-xdp was built; install clang ...").
//!
//! All `unsafe` is in the private `sys` module.
#![deny(unsafe_code)]

mod layout;
pub mod offload;
mod sys;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Duration;

use aya::maps::{
    Array, HashMap as BpfHashMap, Map, MapData, MapError, PerCpuArray, RingBuf, XskMap,
};
use aya::programs::{ProgramError, TestRun, TestRunOptions, Xdp, XdpMode};
use aya::{Ebpf, EbpfError};
use buffet_dispatch::classifier::Match;
use buffet_dispatch::{Event, OverloadReport, RuleError, TenantSlot, WorkerId};
use buffet_sdk::ParseError;

pub use layout::{
    KEY_WORDS, MAX_QUEUES, MAX_RULE_ENTRIES, MAX_TENANTS, MAX_TUPLES, MAX_WORKERS, XSK_STRIDE,
};

use layout::{
    stat, verdict, Config, DecisionRecord, EventRecord, RuleKey, RuleVal, TenantRow, Tuple,
    WorkerRow, BANKS, EV_MIGRATION, EV_OVERLOAD, F_META, F_TAG_DSCP, F_TEST,
};

/// The compiled driver/generic-mode program (empty when clang was missing).
static DISPATCHER_OBJ: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/dispatcher.bpf.o"));

/// The compiled nfp offload subset (empty when clang was missing). It is not loaded
/// here (offload needs an nfp device); tests/nfp_subset.rs checks it against the nfp
/// JIT's rules, and its host build runs in [`offload::OffloadDispatcher`].
static OFFLOAD_OBJ: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/dispatcher_offload.bpf.o"));

/// The offload subset built without its queue-select store (`-DBF_OFFLOAD_HOST_BUILD`),
/// which loads anywhere: what [`offload::OffloadDispatcher`] runs here.
static OFFLOAD_HOST_OBJ: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/dispatcher_offload_host.bpf.o"));

/// Why the program cannot be built here, if it cannot.
pub const UNAVAILABLE: Option<&str> = option_env!("BUFFET_XDP_UNAVAILABLE");

/// The program's name in the object.
pub const PROGRAM_NAME: &str = buffet_io::afxdp::DISPATCHER_PROGRAM;

/// How long a rule change waits for the program runs still holding a rule bank (a run
/// holds one for a single search and schedule step, microseconds) before it gives up
/// with `TimedOut`.
pub const BANK_WAIT: Duration = Duration::from_secs(1);

/// How long after a map change the host waits before relying on it: a program run that
/// read the maps before the change finishes within microseconds (one frame), so 20 ms is
/// ample on any machine that is not swapping.
pub const GRACE: Duration = Duration::from_millis(20);

/// The compiled XDP dispatcher object (ELF), or why it was not built.
pub fn dispatcher_object() -> Result<&'static [u8], LoadError> {
    match UNAVAILABLE {
        Some(why) => Err(LoadError::Unavailable(why)),
        None => Ok(DISPATCHER_OBJ),
    }
}

/// The compiled nfp offload subset (nic-firmware/xdp/dispatcher_offload.bpf.c), or why
/// it was not built.
pub fn offload_object() -> Result<&'static [u8], LoadError> {
    match UNAVAILABLE {
        Some(why) => Err(LoadError::Unavailable(why)),
        None => Ok(OFFLOAD_OBJ),
    }
}

/// The offload subset's host build (see [`OFFLOAD_HOST_OBJ`]), or why it was not built.
fn offload_host_object() -> Result<&'static [u8], LoadError> {
    match UNAVAILABLE {
        Some(why) => Err(LoadError::Unavailable(why)),
        None => Ok(OFFLOAD_HOST_OBJ),
    }
}

/// How the program runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XdpConfig {
    /// `timeslot = ts_ns >> shift`.
    pub shift: u32,
    /// Overload reports while a worker's TIMES exceeds this.
    pub threshold: u32,
    /// Write the tenant slot into DSCP (slots 0..=63; others are left untagged).
    pub tag_dscp: bool,
    /// Write the tenant slot (32 bits) into the frame's XDP metadata.
    pub metadata: bool,
    /// Test mode: timestamps come from [`XdpDispatcher::run`], not the clock, and the
    /// program records a decision per packet instead of redirecting.
    pub test_mode: bool,
    /// The Port id the classifier sees as the frames' in_port.
    pub in_port: u16,
}

/// Loading the program failed; nothing stays loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// This build has no compiled program.
    #[error("xdp engine unavailable: {0}")]
    Unavailable(&'static str),
    /// aya could not load the object (maps, BTF, relocations).
    #[error("loading the XDP dispatcher's maps (needs CAP_BPF): {0}")]
    Object(#[source] Box<EbpfError>),
    /// The kernel refused the program (verifier, permissions).
    #[error("loading the XDP dispatcher program (needs CAP_BPF and CAP_NET_ADMIN): {0}")]
    Program(#[source] ProgramError),
    /// A map the loader needs is missing or of the wrong type.
    #[error("XDP dispatcher map {name}: {source}")]
    Map {
        /// The map.
        name: &'static str,
        /// What went wrong.
        #[source]
        source: MapError,
    },
    /// The object lacks a map or the program.
    #[error("the XDP dispatcher object has no {0}")]
    Missing(&'static str),
    /// Mapping the Tenant/Worker Table into this process failed.
    #[error("mapping the XDP dispatcher's tables: {0}")]
    Mmap(#[source] io::Error),
    /// A map of the compiled object does not have the size this loader was built for
    /// (nic-firmware/xdp/buffet_xdp.h and `layout.rs` disagree): writing it would miss
    /// entries or address beyond it.
    #[error(
        "XDP dispatcher map {name} has {found} {what}, this loader expects {expected} \
         (nic-firmware/xdp/buffet_xdp.h and buffet-xdp's layout.rs disagree)"
    )]
    Size {
        /// The map.
        name: &'static str,
        /// What is counted: `entries`, or `bytes per value`.
        what: &'static str,
        /// Its entries in the loaded object.
        found: u32,
        /// The entries the loader's constants give it.
        expected: u32,
    },
}

/// Why a worker or a tenant was refused. On error nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    /// The Worker Table is full.
    #[error("the XDP dispatcher holds at most {capacity} workers")]
    TooManyWorkers {
        /// [`MAX_WORKERS`].
        capacity: u16,
    },
    /// The slot is beyond the Tenant Table.
    #[error("{tenant}: the XDP dispatcher's maps hold tenant slots 0..{capacity} only")]
    TooManyTenants {
        /// The tenant refused.
        tenant: TenantSlot,
        /// [`MAX_TENANTS`].
        capacity: u32,
    },
    /// The slot is taken.
    #[error("{0} is already admitted to the XDP dispatcher")]
    DuplicateSlot(TenantSlot),
    /// The worker does not exist.
    #[error("{tenant}: no worker {worker}")]
    UnknownWorker {
        /// The tenant refused.
        tenant: TenantSlot,
        /// Its worker.
        worker: u16,
    },
    /// A rule is invalid for any classifier.
    #[error("{tenant}, rule {index}: {source}")]
    InvalidRule {
        /// The tenant refused.
        tenant: TenantSlot,
        /// Position of the rule in its list.
        index: usize,
        /// What is wrong with it.
        source: RuleError,
    },
    /// A rule the XDP classifier cannot express: its expansion needs more distinct masks
    /// than the program probes.
    #[error(
        "{tenant}, rule {index}: the XDP classifier cannot express it: it needs {needed} \
         distinct masks in all and the program probes at most {capacity} (narrow its port \
         ranges)"
    )]
    TooManyMasks {
        /// The tenant refused.
        tenant: TenantSlot,
        /// Position of the rule in its list.
        index: usize,
        /// Masks in use with this rule added.
        needed: usize,
        /// [`MAX_TUPLES`].
        capacity: u32,
    },
    /// The rules map is full.
    #[error(
        "{tenant}, rule {index}: the XDP classifier cannot express it: {needed} (mask, \
         value) entries in all, the map holds {capacity}"
    )]
    TooManyEntries {
        /// The tenant refused.
        tenant: TenantSlot,
        /// Position of the rule in its list.
        index: usize,
        /// Entries with this rule added.
        needed: usize,
        /// [`MAX_RULE_ENTRIES`].
        capacity: u32,
    },
    /// [`XdpDispatcher::replace_rules`] of a slot that is not admitted.
    #[error("{0} is not admitted to the XDP dispatcher")]
    NotAdmitted(TenantSlot),
    /// Writing a map failed.
    #[error("writing the XDP dispatcher's maps: {0}")]
    Map(#[source] MapError),
}

/// Why a tenant's rules cannot go into the XDP classifier (a dry run: see
/// [`XdpDispatcher::check_rules`]).
#[derive(Debug, thiserror::Error)]
pub enum RuleCheckError {
    /// A rule is invalid for any classifier.
    #[error("rules[{index}]: {source}")]
    InvalidRule {
        /// Position of the rule in its list.
        index: usize,
        /// What is wrong with it.
        source: RuleError,
    },
    /// The rule's expansion needs more distinct masks than the program probes.
    #[error(
        "rules[{index}]: the XDP classifier cannot express it: it needs {needed} distinct \
         masks in all and the program probes at most {capacity} (narrow its port ranges)"
    )]
    TooManyMasks {
        /// Position of the rule in its list.
        index: usize,
        /// Masks in use with this rule added.
        needed: usize,
        /// [`MAX_TUPLES`].
        capacity: u32,
    },
    /// The rules map would be full.
    #[error(
        "rules[{index}]: the XDP classifier cannot express it: {needed} (mask, value) \
         entries in all, the map holds {capacity}"
    )]
    TooManyEntries {
        /// Position of the rule in its list.
        index: usize,
        /// Entries with this rule added.
        needed: usize,
        /// [`MAX_RULE_ENTRIES`].
        capacity: u32,
    },
}

impl RuleCheckError {
    /// The same refusal for tenant `slot`'s admission.
    fn for_tenant(self, slot: TenantSlot) -> AdmitError {
        match self {
            RuleCheckError::InvalidRule { index, source } => AdmitError::InvalidRule {
                tenant: slot,
                index,
                source,
            },
            RuleCheckError::TooManyMasks {
                index,
                needed,
                capacity,
            } => AdmitError::TooManyMasks {
                tenant: slot,
                index,
                needed,
                capacity,
            },
            RuleCheckError::TooManyEntries {
                index,
                needed,
                capacity,
            } => AdmitError::TooManyEntries {
                tenant: slot,
                index,
                needed,
                capacity,
            },
        }
    }
}

/// Why a Worker Table change was refused; nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum WorkerTableError {
    /// No such worker, or its row is already closed.
    #[error("worker {0} is not live in the XDP dispatcher's Worker Table")]
    NotLive(u16),
    /// Closing it would leave the program no live worker.
    #[error("worker {0} is the XDP dispatcher's last live worker")]
    LastWorker(u16),
}

/// Why a worker's socket could not go into (or leave) the XSKMAP; on error the map did
/// not change.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// The queue has no keys in the XSKMAP.
    #[error(
        "receive queue {queue}: the XDP dispatcher's XSKMAP holds sockets for queues 0 to {} \
         ({capacity} queues of {} workers)",
        capacity - 1,
        XSK_STRIDE
    )]
    QueueOutOfRange {
        /// The queue asked for.
        queue: u32,
        /// [`MAX_QUEUES`].
        capacity: u32,
    },
    /// The worker is beyond the Worker Table (and has no keys).
    #[error("worker {worker}: the XDP dispatcher's XSKMAP holds sockets for workers 0 to {}", capacity - 1)]
    WorkerOutOfRange {
        /// The worker asked for.
        worker: u16,
        /// [`XSK_STRIDE`].
        capacity: u32,
    },
    /// Writing the map failed.
    #[error("worker {worker}'s socket on queue {queue} in the XSKMAP: {source}")]
    Map {
        /// The worker.
        worker: u16,
        /// The queue.
        queue: u32,
        /// What went wrong.
        #[source]
        source: MapError,
    },
}

/// The XSKMAP key of worker `w`'s socket on receive queue `queue` (`queue * XSK_STRIDE
/// + w`), the key the program redirects a frame of that queue to when it chooses `w`;
/// refused for a queue beyond [`MAX_QUEUES`] or a worker beyond [`XSK_STRIDE`].
pub fn xsk_key(queue: u32, w: WorkerId) -> Result<u32, SocketError> {
    check_queues(&[queue])?;
    if u32::from(w.0) >= XSK_STRIDE {
        return Err(SocketError::WorkerOutOfRange {
            worker: w.0,
            capacity: XSK_STRIDE,
        });
    }
    Ok(queue * XSK_STRIDE + u32::from(w.0))
}

/// Checks that every receive queue of `queues` has keys in the program's XSKMAP: the
/// first that does not is [`SocketError::QueueOutOfRange`], naming it and the limit.
pub fn check_queues(queues: &[u32]) -> Result<(), SocketError> {
    match queues.iter().find(|&&q| q >= MAX_QUEUES) {
        Some(&queue) => Err(SocketError::QueueOutOfRange {
            queue,
            capacity: MAX_QUEUES,
        }),
        None => Ok(()),
    }
}

/// Running a frame through the program failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// [`XdpDispatcher::run`] needs [`XdpConfig::test_mode`].
    #[error("the XDP dispatcher was not loaded in test mode")]
    NotTestMode,
    /// Reading or writing a map failed.
    #[error("XDP dispatcher map: {0}")]
    Map(#[source] MapError),
    /// BPF_PROG_TEST_RUN failed.
    #[error("BPF_PROG_TEST_RUN: {0}")]
    TestRun(#[source] ProgramError),
    /// The program returned XDP_ABORTED.
    #[error("the XDP dispatcher aborted on a {len}-byte frame")]
    Aborted {
        /// Frame length.
        len: usize,
    },
    /// BPF_PROG_TEST_RUN takes no frame shorter than an Ethernet header (and no NIC
    /// delivers one).
    #[error("a {len}-byte frame is shorter than an Ethernet header")]
    TooShort {
        /// Frame length.
        len: usize,
    },
    /// The program did not record a decision.
    #[error("the XDP dispatcher recorded no decision")]
    NoDecision,
}

/// Attaching the program to an interface failed; nothing stays attached.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The interface does not exist.
    #[error("interface {0:?} does not exist")]
    NoSuchInterface(String),
    /// Another program holds the interface's XDP hook and is not a leftover of a Buffet
    /// run that died (or could not be removed).
    #[error("{iface} already has an XDP program attached: {why}")]
    Busy {
        /// The interface.
        iface: String,
        /// Which program, and whose.
        why: String,
    },
    /// Telling whether the program in the way is a leftover failed (privileges, the
    /// interface went away).
    #[error("attaching the XDP dispatcher to {iface}: {why}")]
    Check {
        /// The interface.
        iface: String,
        /// What went wrong.
        why: String,
    },
    /// The driver's native XDP cannot take frames of the interface's MTU (the kernel's
    /// `ERANGE`).
    #[error("attaching the XDP dispatcher to {iface}: {why}")]
    NativeMtu {
        /// The interface.
        iface: String,
        /// What it means and what to do.
        why: String,
    },
    /// The netlink/link attach failed.
    #[error("attaching the XDP dispatcher to {iface}: {source}")]
    Attach {
        /// The interface.
        iface: String,
        /// What went wrong.
        #[source]
        source: ProgramError,
    },
}

/// What the program decided for one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpDecision {
    /// To `worker`, for `tenant`.
    Pass {
        /// The chosen worker.
        worker: WorkerId,
        /// The tenant slot.
        tenant: TenantSlot,
        /// The tenant moved from this worker with this packet.
        migrated_from: Option<WorkerId>,
        /// The overload report this packet raised.
        overload: Option<OverloadReport>,
    },
    /// The frame did not parse.
    Malformed(ParseError),
    /// No rule matched.
    Unmatched,
    /// Over the tenant's MAX_NB.
    Policed(TenantSlot),
    /// The tenant's worker is gone and none is live.
    NoLiveWorker,
}

/// One frame through the program in test mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XdpRun {
    /// The decision.
    pub decision: XdpDecision,
    /// The frame as the program left it (DSCP tag applied), without the metadata.
    pub frame: Vec<u8>,
    /// The 32-bit tenant slot the program wrote into the XDP metadata, if any.
    pub metadata: Option<u32>,
}

/// The program's counters, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XdpStats {
    /// Frames seen.
    pub packets: u64,
    /// Frames passed to a worker.
    pub passed: u64,
    /// Frames that did not parse.
    pub malformed: u64,
    /// Frames no rule matched.
    pub unmatched: u64,
    /// Frames over their tenant's MAX_NB.
    pub policed: u64,
    /// Frames with no live worker.
    pub no_live_worker: u64,
    /// Events the ring buffer had no room for.
    pub events_lost: u64,
    /// Passed frames (counted in `passed` too) dropped because their worker has no
    /// socket on the queue they arrived on: the interface has queues the run does not
    /// read.
    pub no_socket: u64,
}

/// Runs frames through a test-mode [`XdpDispatcher`]'s program from another thread
/// ([`XdpDispatcher::test_runner`]), at the timestamp of the dispatcher's last
/// [`run`](XdpDispatcher::run) (0 before any), while the dispatcher's owner changes its
/// maps. It shares the program's decision map: use one of them at a time to run frames.
/// Events the runs raise stay in the ring buffer for
/// [`drain_events`](XdpDispatcher::drain_events).
pub struct XdpTestRunner {
    prog: OwnedFd,
    decision: Array<MapData, DecisionRecord>,
    last_seq: Option<u64>,
}

impl std::fmt::Debug for XdpTestRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpTestRunner").finish_non_exhaustive()
    }
}

impl XdpTestRunner {
    /// The program's decision for `frame` (the frame it leaves is not kept).
    pub fn run(&mut self, frame: &[u8]) -> Result<XdpDecision, RunError> {
        if frame.len() < 14 {
            return Err(RunError::TooShort { len: frame.len() });
        }
        let last = match self.last_seq {
            Some(s) => s,
            None => self.decision.get(&0, 0).map_err(RunError::Map)?.seq,
        };
        let mut out = vec![0u8; frame.len() + 64];
        let (ret, _) = sys::prog_test_run(self.prog.as_fd(), frame, &mut out)
            .map_err(|e| RunError::TestRun(ProgramError::IOError(e)))?;
        if ret == 0 {
            return Err(RunError::Aborted { len: frame.len() });
        }
        let rec = self.decision.get(&0, 0).map_err(RunError::Map)?;
        if rec.seq == last {
            return Err(RunError::NoDecision);
        }
        self.last_seq = Some(rec.seq);
        let migrated_from = (rec.migrated != 0).then_some(WorkerId(rec.from));
        let overload = (rec.overload != 0).then_some(OverloadReport {
            worker: WorkerId(rec.overload_worker),
            slot: rec.overload_slot,
        });
        Ok(decision_of(&rec, migrated_from, overload))
    }
}

/// How to attach.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttachMode {
    /// Generic (skb) XDP: every driver, veth included.
    #[default]
    Generic,
    /// Native (driver) XDP.
    Native,
}

/// One rule's presence in the rules map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    priority: u32,
    seq: u64,
    tenant: u32,
}

/// One rule change of the model, under way: each key it touched with its bucket before
/// (None: absent), and the tuples and sequence before.
struct Change {
    before: HashMap<RuleKey, Option<BTreeSet<Entry>>>,
    tuples: BTreeMap<[u64; KEY_WORDS], u32>,
    tuple_use: Vec<usize>,
    next_seq: u64,
}

impl Change {
    /// Records `key`'s bucket before its first change.
    fn touch(&mut self, key: RuleKey, buckets: &HashMap<RuleKey, BTreeSet<Entry>>) {
        self.before
            .entry(key)
            .or_insert_with(|| buckets.get(&key).cloned());
    }
}

/// The XDP Packet Dispatcher, loaded. Dropping it detaches and unloads the program.
pub struct XdpDispatcher {
    ebpf: Ebpf,
    cfg: XdpConfig,
    config: Array<MapData, Config>,
    tuples_map: Array<MapData, Tuple>,
    rules_map: BpfHashMap<MapData, RuleKey, RuleVal>,
    decision: Array<MapData, DecisionRecord>,
    /// The decision map again, for [`XdpTestRunner`]s.
    decision_fd: OwnedFd,
    stats: PerCpuArray<MapData, u64>,
    /// Policed packets per tenant slot.
    policed: PerCpuArray<MapData, u64>,
    events: RingBuf<MapData>,
    xsks: XskMap<MapData>,
    /// The receive queues each worker has a socket on in the XSKMAP.
    sockets: BTreeMap<u16, BTreeSet<u32>>,
    state: sys::StateMapping,
    n_workers: u16,
    /// Mask -> tuple index.
    tuples: BTreeMap<[u64; KEY_WORDS], u32>,
    /// Entries per tuple, to free a tuple when its last entry goes.
    tuple_use: Vec<usize>,
    /// (tuple, masked value) -> the rules there; the map holds the first.
    buckets: HashMap<RuleKey, BTreeSet<Entry>>,
    /// Per tenant slot: its rules' (seq, keys).
    by_tenant: HashMap<u32, Vec<(Entry, Vec<RuleKey>)>>,
    /// The rule bank the program classifies against (the state map's active word).
    active: u32,
    /// A bank a failed write left unlike the model: rewritten whole before its next use.
    stale_bank: Option<u32>,
    /// Program runs holding each rule bank, per CPU.
    readers: PerCpuArray<MapData, u64>,
    next_seq: u64,
    last_decision_seq: u64,
    attached: Option<(String, aya::programs::xdp::XdpLinkId)>,
    replaced_leftover: bool,
    pending: Vec<Event>,
}

impl std::fmt::Debug for XdpDispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpDispatcher")
            .field("cfg", &self.cfg)
            .field("workers", &self.n_workers)
            .field("tuples", &self.tuples.len())
            .field("entries", &self.buckets.len())
            .field("attached", &self.attached.as_ref().map(|a| &a.0))
            .finish()
    }
}

/// Why [`XdpDispatcher::attach`] leaves the program in its way: it is not a dead run's
/// ([`AttachError::Busy`]), or that could not be told ([`AttachError::Check`]).
/// Whether the kernel answered `ERANGE` somewhere in `e`'s chain.
fn is_erange(e: &ProgramError) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io.raw_os_error() == Some(libc::ERANGE) {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

fn refused(iface: &str, e: buffet_io::afxdp::AfXdpError) -> AttachError {
    match e {
        buffet_io::afxdp::AfXdpError::Busy {
            id,
            name,
            why,
            advice,
            ..
        } => {
            let whose = if why.is_empty() {
                ", not a leftover of a Buffet run".to_string()
            } else {
                why
            };
            AttachError::Busy {
                iface: iface.into(),
                why: format!("{name:?} (id {id}){whose}; {advice}"),
            }
        }
        other => AttachError::Check {
            iface: iface.into(),
            why: other.to_string(),
        },
    }
}

/// Loads `obj`'s maps and its XDP program `name` (verified by the kernel); `missing`
/// names the program in the error when the object has none of that name.
fn load_program(obj: &[u8], name: &str, missing: &'static str) -> Result<Ebpf, LoadError> {
    let mut ebpf = Ebpf::load(obj).map_err(|e| LoadError::Object(Box::new(e)))?;
    let prog: &mut Xdp = ebpf
        .program_mut(name)
        .ok_or(LoadError::Missing(missing))?
        .try_into()
        .map_err(LoadError::Program)?;
    prog.load().map_err(LoadError::Program)?;
    Ok(ebpf)
}

fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<Map, LoadError> {
    ebpf.take_map(name).ok_or(LoadError::Missing(name))
}

/// The maps whose sizes the loader computes keys for, with the entries it expects.
const SIZED_MAPS: [(&str, u32); 5] = [
    ("bf_xsks", MAX_QUEUES * XSK_STRIDE),
    ("bf_policed", MAX_TENANTS),
    ("bf_tuples", BANKS * MAX_TUPLES),
    ("bf_rules", BANKS * MAX_RULE_ENTRIES),
    ("bf_bank_readers", BANKS),
];

/// Checks that each of [`SIZED_MAPS`] has the entries the loader's constants give it,
/// and that the state map's one value is the `State` the loader maps (its Tenant and
/// Worker Tables: a different MAX_TENANTS in C would move the Worker Table silently).
fn check_sizes(ebpf: &Ebpf) -> Result<(), LoadError> {
    let info = |name: &'static str| {
        let map = ebpf.map(name).ok_or(LoadError::Missing(name))?;
        map_data(map)
            .ok_or(LoadError::Missing(name))?
            .info()
            .map_err(map_err(name))
    };
    for (name, expected) in SIZED_MAPS {
        check_size(name, "entries", info(name)?.max_entries(), expected)?;
    }
    let state = info("bf_state")?;
    check_size("bf_state", "entries", state.max_entries(), 1)?;
    check_size(
        "bf_state",
        "bytes per value",
        state.value_size(),
        std::mem::size_of::<layout::State>() as u32,
    )
}

fn check_size(
    name: &'static str,
    what: &'static str,
    found: u32,
    expected: u32,
) -> Result<(), LoadError> {
    if found == expected {
        Ok(())
    } else {
        Err(LoadError::Size {
            name,
            what,
            found,
            expected,
        })
    }
}

/// The kernel map behind `map`, for the map types [`SIZED_MAPS`] uses.
fn map_data(map: &Map) -> Option<&MapData> {
    match map {
        Map::XskMap(d) | Map::PerCpuArray(d) | Map::Array(d) | Map::HashMap(d) => Some(d),
        _ => None,
    }
}

fn map_err(name: &'static str) -> impl Fn(MapError) -> LoadError {
    move |source| LoadError::Map { name, source }
}

impl XdpDispatcher {
    /// Loads the program (verified by the kernel) with no workers, tenants or rules.
    pub fn load(cfg: XdpConfig) -> Result<XdpDispatcher, LoadError> {
        let mut ebpf = load_program(
            dispatcher_object()?,
            PROGRAM_NAME,
            "program buffet_dispatch",
        )?;
        check_sizes(&ebpf)?;
        let mut config: Array<MapData, Config> =
            Array::try_from(take_map(&mut ebpf, "bf_config")?).map_err(map_err("bf_config"))?;
        let tuples_map =
            Array::try_from(take_map(&mut ebpf, "bf_tuples")?).map_err(map_err("bf_tuples"))?;
        let rules_map =
            BpfHashMap::try_from(take_map(&mut ebpf, "bf_rules")?).map_err(map_err("bf_rules"))?;
        let decision_map = take_map(&mut ebpf, "bf_decision")?;
        let decision_fd = match &decision_map {
            Map::Array(data) => data.fd().as_fd().try_clone_to_owned().map_err(|io_error| {
                map_err("bf_decision")(MapError::SyscallError(aya::sys::SyscallError {
                    call: "dup",
                    io_error,
                }))
            })?,
            _ => return Err(LoadError::Missing("array map bf_decision")),
        };
        let decision = Array::try_from(decision_map).map_err(map_err("bf_decision"))?;
        let stats =
            PerCpuArray::try_from(take_map(&mut ebpf, "bf_stats")?).map_err(map_err("bf_stats"))?;
        let policed = PerCpuArray::try_from(take_map(&mut ebpf, "bf_policed")?)
            .map_err(map_err("bf_policed"))?;
        let readers = PerCpuArray::try_from(take_map(&mut ebpf, "bf_bank_readers")?)
            .map_err(map_err("bf_bank_readers"))?;
        let events =
            RingBuf::try_from(take_map(&mut ebpf, "bf_events")?).map_err(map_err("bf_events"))?;
        let xsks = XskMap::try_from(take_map(&mut ebpf, "bf_xsks")?).map_err(map_err("bf_xsks"))?;
        let state = match take_map(&mut ebpf, "bf_state")? {
            Map::Array(data) => {
                sys::StateMapping::new(data.fd().as_fd()).map_err(LoadError::Mmap)?
            }
            _ => return Err(LoadError::Missing("array map bf_state")),
        };
        let mut flags = 0;
        if cfg.test_mode {
            flags |= F_TEST;
        }
        if cfg.tag_dscp {
            flags |= F_TAG_DSCP;
        }
        if cfg.metadata {
            flags |= F_META;
        }
        config
            .set(
                0,
                Config {
                    flags,
                    shift: cfg.shift,
                    threshold: cfg.threshold,
                    in_port: cfg.in_port,
                    ..Config::default()
                },
                0,
            )
            .map_err(map_err("bf_config"))?;
        Ok(XdpDispatcher {
            ebpf,
            cfg,
            config,
            tuples_map,
            rules_map,
            decision,
            decision_fd,
            stats,
            policed,
            events,
            xsks,
            sockets: BTreeMap::new(),
            state,
            n_workers: 0,
            tuples: BTreeMap::new(),
            tuple_use: Vec::new(),
            buckets: HashMap::new(),
            by_tenant: HashMap::new(),
            active: 0,
            stale_bank: None,
            readers,
            next_seq: 0,
            last_decision_seq: 0,
            attached: None,
            replaced_leftover: false,
            pending: Vec::new(),
        })
    }

    /// The kernel's id of the loaded program (what `bpftool prog show id` takes; its maps
    /// are listed there).
    pub fn program_id(&self) -> Result<u32, ProgramError> {
        Ok(self.xdp()?.info()?.id())
    }

    /// The loaded program, as an XDP program.
    fn xdp(&self) -> Result<&Xdp, ProgramError> {
        self.ebpf
            .program(PROGRAM_NAME)
            .expect("loaded program")
            .try_into()
    }

    /// The configuration it was loaded with.
    pub fn config(&self) -> XdpConfig {
        self.cfg
    }

    fn update_config(&mut self, f: impl FnOnce(&mut Config)) -> Result<(), MapError> {
        let mut c = self.config.get(&0, 0)?;
        f(&mut c);
        self.config.set(0, c, 0)
    }

    /// Adds a live worker with MAX_NB `max_nb` (taken literally: 0 is always overloaded).
    pub fn add_worker(&mut self, max_nb: u64) -> Result<WorkerId, AdmitError> {
        if self.n_workers >= MAX_WORKERS {
            return Err(AdmitError::TooManyWorkers {
                capacity: MAX_WORKERS,
            });
        }
        let w = self.n_workers;
        self.state.set_worker(
            w,
            WorkerRow {
                max_nb,
                live: 1,
                ..WorkerRow::default()
            },
        );
        let n = u32::from(w) + 1;
        self.update_config(|c| c.n_workers = n)
            .map_err(AdmitError::Map)?;
        self.n_workers += 1;
        Ok(WorkerId(w))
    }

    /// Number of workers.
    pub fn worker_count(&self) -> u16 {
        self.n_workers
    }

    /// Puts worker `w`'s AF_XDP socket on receive queue `queue` into the XSKMAP (at
    /// [`xsk_key`]`(queue, w)`): the redirect target of the frames of that queue the
    /// program chooses `w` for. The socket must be bound to that queue of the interface
    /// the program is attached to (the kernel delivers a redirect to no other). A worker
    /// has one such socket per queue; a frame on a queue where its worker has none is
    /// dropped, counted as passed like any other and as `no_socket`. A worker's sockets may go in
    /// before its row is added ([`add_worker`](Self::add_worker)), so that the program
    /// sends it nothing it cannot receive.
    pub fn set_worker_socket(
        &mut self,
        w: WorkerId,
        queue: u32,
        socket: &impl AsRawFd,
    ) -> Result<(), SocketError> {
        let key = xsk_key(queue, w)?;
        self.xsks
            .set(key, socket.as_raw_fd(), 0)
            .map_err(|source| SocketError::Map {
                worker: w.0,
                queue,
                source,
            })?;
        self.sockets.entry(w.0).or_default().insert(queue);
        Ok(())
    }

    /// The receive queues worker `w` has a socket on in the XSKMAP, in order.
    pub fn worker_socket_queues(&self, w: WorkerId) -> Vec<u32> {
        self.sockets
            .get(&w.0)
            .map(|q| q.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Admits tenant `slot` on `worker` with MAX_NB `max_nb` (0: unlimited) and its
    /// classifier `rules` (`(priority, match)`: lower priority wins; equal priorities,
    /// earlier admitted first, as in buffet-dispatch). Refused, changing nothing, when
    /// the slot, a rule or the maps' capacity does not allow it.
    pub fn admit(
        &mut self,
        slot: TenantSlot,
        rules: &[(u32, Match)],
        max_nb: u64,
        worker: WorkerId,
    ) -> Result<(), AdmitError> {
        if slot.0 >= MAX_TENANTS {
            return Err(AdmitError::TooManyTenants {
                tenant: slot,
                capacity: MAX_TENANTS,
            });
        }
        if self.state.tenant(slot.0).present != 0 {
            return Err(AdmitError::DuplicateSlot(slot));
        }
        if worker.0 >= self.n_workers {
            return Err(AdmitError::UnknownWorker {
                tenant: slot,
                worker: worker.0,
            });
        }
        // Plan every entry first: nothing is written unless all of it fits.
        let planned = self.plan(rules).map_err(|e| e.for_tenant(slot))?;
        // Its policed count starts from nothing (the slot may have served a tenant before).
        self.reset_policed(slot).map_err(AdmitError::Map)?;
        // The row first, so a packet classified to the tenant always finds it.
        self.state.set_tenant(
            slot.0,
            TenantRow {
                max_nb,
                worker: worker.0,
                present: 1,
                ..TenantRow::default()
            },
        );
        let mut change = self.begin_change();
        let mine = self.model_insert(&mut change, slot, planned);
        if let Err(e) = self.publish(change) {
            // No packet was classified to it (the change never became active).
            self.state.set_tenant(slot.0, TenantRow::default());
            return Err(AdmitError::Map(e));
        }
        self.by_tenant.insert(slot.0, mine);
        Ok(())
    }

    /// Checks that the XDP classifier can express `rules` next to every rule it holds
    /// now (a dry run of [`admit`](Self::admit)'s planning: nothing is written). For an
    /// update ([`replace_rules`](Self::replace_rules)) it counts the tenant's old rules
    /// as still there, so it may refuse an update that would just fit.
    pub fn check_rules(&self, rules: &[(u32, Match)]) -> Result<(), RuleCheckError> {
        self.plan(rules).map(drop)
    }

    /// Every (priority, key pairs) of `rules`, checked against the maps' capacity.
    fn plan(&self, rules: &[(u32, Match)]) -> Result<Vec<(u32, Vec<KeyPair>)>, RuleCheckError> {
        let mut new_masks: Vec<[u64; KEY_WORDS]> = Vec::new();
        let mut planned: Vec<(u32, Vec<KeyPair>)> = Vec::new();
        let mut entries = self.buckets.len();
        let mut new_buckets: BTreeSet<([u64; KEY_WORDS], [u64; KEY_WORDS])> = BTreeSet::new();
        for (index, (priority, m)) in rules.iter().enumerate() {
            m.validate()
                .map_err(|source| RuleCheckError::InvalidRule { index, source })?;
            let pairs = m.key_pairs();
            for (mask, val) in &pairs {
                if !self.tuples.contains_key(mask) && !new_masks.contains(mask) {
                    new_masks.push(*mask);
                }
                let exists = self
                    .tuples
                    .get(mask)
                    .is_some_and(|&t| self.buckets.contains_key(&rule_key(t, val)));
                if !exists && new_buckets.insert((*mask, *val)) {
                    entries += 1;
                }
            }
            let needed = self.tuples.len() + new_masks.len();
            if needed > MAX_TUPLES as usize {
                return Err(RuleCheckError::TooManyMasks {
                    index,
                    needed,
                    capacity: MAX_TUPLES,
                });
            }
            if entries > MAX_RULE_ENTRIES as usize {
                return Err(RuleCheckError::TooManyEntries {
                    index,
                    needed: entries,
                    capacity: MAX_RULE_ENTRIES,
                });
            }
            planned.push((*priority, pairs));
        }
        Ok(planned)
    }

    /// Starts a rule change: what [`revert`](Self::revert) needs to undo it in the
    /// model and what [`publish`](Self::publish) needs to write it.
    fn begin_change(&self) -> Change {
        Change {
            before: HashMap::new(),
            tuples: self.tuples.clone(),
            tuple_use: self.tuple_use.clone(),
            next_seq: self.next_seq,
        }
    }

    /// Adds planned rules of tenant `slot` to the model (each key's best entry is what
    /// the banks will hold) and returns them as recorded for removal. Writes no map.
    fn model_insert(
        &mut self,
        change: &mut Change,
        slot: TenantSlot,
        planned: Vec<(u32, Vec<KeyPair>)>,
    ) -> Vec<(Entry, Vec<RuleKey>)> {
        let base = self.next_seq;
        self.next_seq += planned.len() as u64;
        let mut mine = Vec::with_capacity(planned.len());
        for (index, (priority, pairs)) in planned.into_iter().enumerate() {
            let entry = Entry {
                priority,
                seq: base + index as u64,
                tenant: slot.0,
            };
            let mut keys = Vec::with_capacity(pairs.len());
            for (mask, val) in pairs {
                let t = self.model_tuple(mask);
                let key = rule_key(t, &val);
                change.touch(key, &self.buckets);
                if self.buckets.entry(key).or_default().insert(entry) {
                    self.tuple_use[t as usize] += 1;
                }
                keys.push(key);
            }
            mine.push((entry, keys));
        }
        mine
    }

    /// The tuple index of `mask` in the model, adding it (a freed index first).
    fn model_tuple(&mut self, mask: [u64; KEY_WORDS]) -> u32 {
        if let Some(&t) = self.tuples.get(&mask) {
            return t;
        }
        let taken: BTreeSet<u32> = self.tuples.values().copied().collect();
        let t = match (0..self.tuple_use.len() as u32)
            .find(|&i| self.tuple_use[i as usize] == 0 && !taken.contains(&i))
        {
            Some(i) => i,
            None => {
                self.tuple_use.push(0);
                (self.tuple_use.len() - 1) as u32
            }
        };
        self.tuples.insert(mask, t);
        t
    }

    /// Takes a tenant's recorded entries out of the model (each key then holds its next
    /// best entry, or nothing) and frees the tuples nobody uses any more (their index
    /// stays probed, and empty). Writes no map.
    fn model_remove(&mut self, change: &mut Change, rules: &[(Entry, Vec<RuleKey>)]) {
        for (entry, keys) in rules {
            for key in keys {
                change.touch(*key, &self.buckets);
                let Some(set) = self.buckets.get_mut(key) else {
                    continue;
                };
                if set.remove(entry) {
                    self.tuple_use[key.tuple as usize] -= 1;
                }
                if set.is_empty() {
                    self.buckets.remove(key);
                }
            }
        }
        let tuple_use = &self.tuple_use;
        self.tuples.retain(|_, t| tuple_use[*t as usize] != 0);
    }

    /// Puts the model back as it was when `change` began.
    fn revert(&mut self, change: Change) {
        for (key, before) in change.before {
            match before {
                Some(set) => self.buckets.insert(key, set),
                None => self.buckets.remove(&key),
            };
        }
        self.tuples = change.tuples;
        self.tuple_use = change.tuple_use;
        self.next_seq = change.next_seq;
    }

    /// Makes a model change visible to the program in one step: the change is written
    /// into the inactive bank, the active word flips to it (one aligned 32-bit store),
    /// the old bank is waited for until no program run holds it, and then the same
    /// change is written there, so both banks hold the model again. A packet is
    /// classified against the old bank or the new one, never a mix.
    ///
    /// On error nothing changed: the model is put back, the active bank was never
    /// written, and the inactive one is put back too (or, should that fail as well,
    /// marked to be rewritten whole before it is next used).
    fn publish(&mut self, change: Change) -> Result<(), MapError> {
        let target = self.active ^ 1;
        let keys: Vec<RuleKey> = change.before.keys().copied().collect();
        let written = if self.stale_bank == Some(target) {
            self.wait_unheld(target)
                .and_then(|()| self.resync_bank(target))
        } else {
            self.write_bank(target, &keys, &change.tuples)
        };
        if let Err(e) = written {
            let failed_tuples = self.tuples.clone();
            self.revert(change);
            if self.stale_bank != Some(target)
                && self.write_bank(target, &keys, &failed_tuples).is_err()
            {
                self.stale_bank = Some(target);
            }
            return Err(e);
        }
        if self.stale_bank == Some(target) {
            self.stale_bank = None;
        }
        let old = self.active;
        self.state.set_active_bank(target);
        self.active = target;
        // The change is in force. The old bank catches up once no run holds it; should
        // that fail, it is rewritten whole (after the same wait) before its next use.
        let caught_up = self
            .wait_unheld(old)
            .and_then(|()| self.write_bank(old, &keys, &change.tuples));
        if caught_up.is_err() {
            self.stale_bank = Some(old);
        }
        Ok(())
    }

    /// Writes the model's entries of `keys` and the tuples that differ from `before`
    /// (mask -> index) into bank `bank`, which no program run may hold: removals first,
    /// so the rules map never holds more than both banks' worth.
    fn write_bank(
        &mut self,
        bank: u32,
        keys: &[RuleKey],
        before: &BTreeMap<[u64; KEY_WORDS], u32>,
    ) -> Result<(), MapError> {
        let old_at: HashMap<u32, &[u64; KEY_WORDS]> = before.iter().map(|(m, t)| (*t, m)).collect();
        for (mask, &t) in &self.tuples {
            if old_at.get(&t) != Some(&mask) {
                self.tuples_map
                    .set(bank * MAX_TUPLES + t, Tuple { mask: *mask }, 0)?;
            }
        }
        for key in keys.iter().filter(|k| !self.buckets.contains_key(k)) {
            match self.rules_map.remove(&RuleKey { bank, ..*key }) {
                Ok(()) => {}
                Err(MapError::SyscallError(e))
                    if e.io_error.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
        for key in keys {
            if let Some(best) = self.buckets.get(key).and_then(|set| set.first()) {
                self.rules_map.insert(
                    RuleKey { bank, ..*key },
                    RuleVal {
                        priority: best.priority,
                        tenant: best.tenant,
                        seq: best.seq,
                    },
                    0,
                )?;
            }
        }
        self.state
            .set_bank_tuples(bank, self.tuple_use.len() as u32);
        Ok(())
    }

    /// Rewrites bank `bank` (which no program run may hold) from the model alone: every
    /// entry of it in the rules map removed, then every tuple and entry written.
    fn resync_bank(&mut self, bank: u32) -> Result<(), MapError> {
        let mut stale = Vec::new();
        for key in self.rules_map.keys() {
            let key = key?;
            if key.bank == bank {
                stale.push(key);
            }
        }
        for key in stale {
            self.rules_map.remove(&key)?;
        }
        let keys: Vec<RuleKey> = self.buckets.keys().copied().collect();
        self.write_bank(bank, &keys, &BTreeMap::new())
    }

    /// Waits until no program run holds bank `bank` (every CPU's reader count for it seen
    /// at 0 after it stopped being active). A run holds a bank for one search and the
    /// schedule step that reads the matched row, with
    /// migration disabled (as every XDP run), so its two adds are on one CPU and the wait
    /// is a few microseconds; a run that reads the active word after the flip never
    /// holds the old bank for its search.
    ///
    /// Gives up after [`BANK_WAIT`] with a `TimedOut` error rather than hang the control
    /// plane should a count never return to 0: before the flip the change is then
    /// refused, after it the old bank is marked stale and waited for again before its
    /// next use.
    fn wait_unheld(&self, bank: u32) -> Result<(), MapError> {
        let start = std::time::Instant::now();
        let mut spins = 0u32;
        loop {
            if self.readers.get(&bank, 0)?.iter().all(|&n| n == 0) {
                return Ok(());
            }
            if start.elapsed() > BANK_WAIT {
                return Err(MapError::SyscallError(aya::sys::SyscallError {
                    call: "wait for the rule bank's readers",
                    io_error: io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("a program run still holds rule bank {bank} after {BANK_WAIT:?}"),
                    ),
                }));
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Removes a tenant: its rules and its row. Returns whether it was admitted.
    pub fn remove(&mut self, slot: TenantSlot) -> Result<bool, MapError> {
        let Some(rules) = self.by_tenant.remove(&slot.0) else {
            return Ok(false);
        };
        let mut change = self.begin_change();
        self.model_remove(&mut change, &rules);
        if let Err(e) = self.publish(change) {
            self.by_tenant.insert(slot.0, rules);
            return Err(e);
        }
        // No program run classifies to it any more (the old bank's holders are gone).
        self.state.set_tenant(slot.0, TenantRow::default());
        Ok(true)
    }

    /// Replaces the classifier rules and MAX_NB of admitted tenant `slot` in place (its
    /// row, worker and counters stay). The rules change in one step: every packet is
    /// classified entirely under the old rules or entirely under the new ones (the
    /// program reads one rule bank per packet; see `publish`), and no other tenant
    /// changes. The new MAX_NB is written after the rules. Refused, changing nothing,
    /// when the maps cannot hold the old and new rules at once or a map write fails.
    pub fn replace_rules(
        &mut self,
        slot: TenantSlot,
        rules: &[(u32, Match)],
        max_nb: u64,
    ) -> Result<(), AdmitError> {
        if slot.0 >= MAX_TENANTS || !self.by_tenant.contains_key(&slot.0) {
            return Err(AdmitError::NotAdmitted(slot));
        }
        let planned = self.plan(rules).map_err(|e| e.for_tenant(slot))?;
        let old = self.by_tenant.get(&slot.0).cloned().unwrap_or_default();
        let mut change = self.begin_change();
        self.model_remove(&mut change, &old);
        let mine = self.model_insert(&mut change, slot, planned);
        self.publish(change).map_err(AdmitError::Map)?;
        self.by_tenant.insert(slot.0, mine);
        self.state.set_tenant_max_nb(slot.0, max_nb);
        Ok(())
    }

    /// The live workers, lowest id first.
    pub fn live_workers(&self) -> Vec<WorkerId> {
        (0..self.n_workers)
            .filter(|&w| self.state.worker(w).live != 0)
            .map(WorkerId)
            .collect()
    }

    /// Tenants per worker (index: worker id), from the Tenant Table rows.
    fn tenants_per_worker(&self) -> Vec<usize> {
        let mut n = vec![0usize; usize::from(self.n_workers)];
        for &slot in self.by_tenant.keys() {
            let r = self.state.tenant(slot);
            if let Some(c) = n.get_mut(usize::from(r.worker)) {
                *c += 1;
            }
        }
        n
    }

    /// The live worker with the fewest tenants (ties: the lowest id), other than
    /// `except`: where a new tenant starts, and where an evacuated worker's tenants go.
    pub fn least_loaded_worker(&self, except: Option<WorkerId>) -> Option<WorkerId> {
        let per = self.tenants_per_worker();
        self.live_workers()
            .into_iter()
            .filter(|w| Some(*w) != except)
            .min_by_key(|w| (per[usize::from(w.0)], w.0))
    }

    /// Closes worker `w`'s Worker Table row after moving every tenant whose row names it
    /// to the live worker with the fewest tenants (only the rows' worker fields are
    /// written, so the program's counters are kept): from then on the program neither
    /// sends it packets nor migrates tenants to it. Its XSKMAP entries (one per queue)
    /// stay until [`clear_worker_socket`](Self::clear_worker_socket), so a frame a
    /// program run already headed there still arrives. A program run that read the row as live just
    /// before it closed can still migrate a tenant to it: call
    /// [`resettle`](Self::resettle) again after a grace period. Returns the moves.
    pub fn close_worker(
        &mut self,
        w: WorkerId,
    ) -> Result<Vec<(TenantSlot, WorkerId)>, WorkerTableError> {
        if w.0 >= self.n_workers || self.state.worker(w.0).live == 0 {
            return Err(WorkerTableError::NotLive(w.0));
        }
        if self.least_loaded_worker(Some(w)).is_none() {
            return Err(WorkerTableError::LastWorker(w.0));
        }
        let moves = self.resettle(w);
        self.state.set_worker_live(w.0, false);
        Ok(moves)
    }

    /// Moves every tenant whose row names worker `w` to the live worker with the fewest
    /// tenants (`w` excluded); returns the moves (none when no other worker is live).
    pub fn resettle(&mut self, w: WorkerId) -> Vec<(TenantSlot, WorkerId)> {
        let mut moves = Vec::new();
        let mut per = self.tenants_per_worker();
        let live: Vec<WorkerId> = self
            .live_workers()
            .into_iter()
            .filter(|&x| x != w)
            .collect();
        let slots: Vec<u32> = self.by_tenant.keys().copied().collect();
        for slot in slots {
            if self.state.tenant(slot).worker != w.0 {
                continue;
            }
            let Some(&to) = live.iter().min_by_key(|x| (per[usize::from(x.0)], x.0)) else {
                break;
            };
            self.state.set_tenant_worker(slot, to.0);
            per[usize::from(to.0)] += 1;
            moves.push((TenantSlot(slot), to));
        }
        moves
    }

    /// Takes worker `w`'s sockets out of the XSKMAP, on every queue (nothing can be
    /// redirected to them any more). On error the entries not yet removed stay and a
    /// second call removes them.
    pub fn clear_worker_socket(&mut self, w: WorkerId) -> Result<(), SocketError> {
        let queues = self.worker_socket_queues(w);
        for queue in queues {
            let key = xsk_key(queue, w)?;
            match self.xsks.unset(key) {
                Ok(()) => {}
                // Already gone (its socket was closed, which empties its entries).
                Err(MapError::SyscallError(e))
                    if e.io_error.raw_os_error() == Some(libc::ENOENT) => {}
                Err(source) => {
                    return Err(SocketError::Map {
                        worker: w.0,
                        queue,
                        source,
                    })
                }
            }
            if let Some(q) = self.sockets.get_mut(&w.0) {
                q.remove(&queue);
            }
        }
        self.sockets.remove(&w.0);
        Ok(())
    }

    /// Whether tenant slot `slot` is admitted.
    pub fn is_admitted(&self, slot: TenantSlot) -> bool {
        self.by_tenant.contains_key(&slot.0)
    }

    /// Runs one frame through the program at `ts_ns` (test mode only): the decision,
    /// the frame as it leaves the program, and its metadata. Events it raised are kept for
    /// [`drain_events`](Self::drain_events) and reported in the decision.
    pub fn run(&mut self, ts_ns: u64, frame: &[u8]) -> Result<XdpRun, RunError> {
        if !self.cfg.test_mode {
            return Err(RunError::NotTestMode);
        }
        if frame.len() < 14 {
            return Err(RunError::TooShort { len: frame.len() });
        }
        self.update_config(|c| c.test_ts = ts_ns)
            .map_err(RunError::Map)?;
        let mut out = vec![0u8; frame.len() + 64];
        let res = {
            let prog = self.xdp().map_err(RunError::TestRun)?;
            let mut opts = TestRunOptions::new();
            opts.data_in = Some(frame);
            opts.data_out = Some(&mut out);
            prog.test_run(opts).map_err(RunError::TestRun)?
        };
        if res.return_value == 0 {
            return Err(RunError::Aborted { len: frame.len() });
        }
        let rec = self.decision.get(&0, 0).map_err(RunError::Map)?;
        if rec.seq == self.last_decision_seq {
            return Err(RunError::NoDecision);
        }
        self.last_decision_seq = rec.seq;
        out.truncate(res.data_size_out as usize);
        // The output starts at data_meta: the metadata, if written, precedes the frame.
        let meta_len = out.len().saturating_sub(frame.len());
        let metadata =
            (meta_len == 4).then(|| u32::from_ne_bytes([out[0], out[1], out[2], out[3]]));
        let frame_out = out.split_off(meta_len);
        let (mut migrated_from, mut overload) = (None, None);
        while let Some(item) = self.events.next() {
            if let Some(ev) = parse_event(&item) {
                match ev {
                    Event::Migration { from, .. } => migrated_from = Some(from),
                    Event::Overload { worker, slot } => {
                        overload = Some(OverloadReport { worker, slot })
                    }
                }
                self.pending.push(ev);
            }
        }
        Ok(XdpRun {
            decision: decision_of(&rec, migrated_from, overload),
            frame: frame_out,
            metadata,
        })
    }

    /// A second handle on the loaded program (test mode only) that runs frames through
    /// it from another thread while this one changes the maps: see [`XdpTestRunner`].
    pub fn test_runner(&self) -> Result<XdpTestRunner, RunError> {
        if !self.cfg.test_mode {
            return Err(RunError::NotTestMode);
        }
        let prog = self.xdp().map_err(RunError::TestRun)?;
        let io = |e: io::Error| RunError::TestRun(ProgramError::IOError(e));
        let prog = prog
            .fd()
            .map_err(RunError::TestRun)?
            .as_fd()
            .try_clone_to_owned()
            .map_err(io)?;
        let decision = MapData::from_fd(self.decision_fd.try_clone().map_err(io)?)
            .and_then(|m| Array::try_from(Map::Array(m)))
            .map_err(RunError::Map)?;
        Ok(XdpTestRunner {
            prog,
            decision,
            last_seq: None,
        })
    }

    /// Events (migrations, overload reports) from the program's ring buffer, oldest
    /// first, including those [`run`](Self::run) already reported.
    pub fn drain_events(&mut self) -> Vec<Event> {
        while let Some(item) = self.events.next() {
            if let Some(ev) = parse_event(&item) {
                self.pending.push(ev);
            }
        }
        std::mem::take(&mut self.pending)
    }

    /// The program's counters, summed over CPUs.
    pub fn stats(&self) -> Result<XdpStats, MapError> {
        let sum = |i: u32| -> Result<u64, MapError> {
            Ok(self
                .stats
                .get(&i, 0)?
                .iter()
                .copied()
                .fold(0u64, u64::wrapping_add))
        };
        Ok(XdpStats {
            packets: sum(stat::PACKETS)?,
            passed: sum(stat::PASSED)?,
            malformed: sum(stat::MALFORMED)?,
            unmatched: sum(stat::UNMATCHED)?,
            policed: sum(stat::POLICED)?,
            no_live_worker: sum(stat::NO_WORKER)?,
            events_lost: sum(stat::EVENTS_LOST)?,
            no_socket: sum(stat::NO_SOCKET)?,
        })
    }

    /// Packets of the tenant in `slot` the program policed (over its MAX_NB), since it
    /// was admitted, summed over CPUs.
    pub fn policed(&self, slot: TenantSlot) -> Result<u64, MapError> {
        if slot.0 >= MAX_TENANTS {
            return Ok(0);
        }
        Ok(self
            .policed
            .get(&slot.0, 0)?
            .iter()
            .copied()
            .fold(0u64, u64::wrapping_add))
    }

    /// Zeroes the policed count of `slot` (a new tenant starts from nothing).
    fn reset_policed(&mut self, slot: TenantSlot) -> Result<(), MapError> {
        let syscall = |call| {
            move |io_error| MapError::SyscallError(aya::sys::SyscallError { call, io_error })
        };
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| syscall("nr_cpus")(e))?;
        let zeros =
            aya::maps::PerCpuValues::try_from(vec![0u64; cpus]).map_err(syscall("nr_cpus"))?;
        self.policed.set(slot.0, zeros, 0)
    }

    /// The Tenant Table row of `slot`: (worker, packets in its current timeslot).
    pub fn tenant_row(&self, slot: TenantSlot) -> Option<(WorkerId, u64)> {
        if slot.0 >= MAX_TENANTS {
            return None;
        }
        let r = self.state.tenant(slot.0);
        (r.present != 0).then_some((WorkerId(r.worker), r.pkt_nb))
    }

    /// The Worker Table row of `w`: (packets in its current timeslot, last_nb, times).
    pub fn worker_row(&self, w: WorkerId) -> Option<(u64, u64, u32)> {
        if w.0 >= self.n_workers {
            return None;
        }
        let r = self.state.worker(w.0);
        Some((r.pkt_nb, r.last_nb, r.times))
    }

    /// Attaches the program to `iface` (for `run --dispatch xdp`). A program a Buffet
    /// run left there when it died (netlink attachments outlive their process) is
    /// detached and replaced: the AF_XDP port's redirect program of a pid that is gone,
    /// or a dispatcher program no live process holds
    /// ([`buffet_io::afxdp::clear_leftover_program`]). Any other program — a live run's,
    /// the operator's own — is not touched ([`AttachError::Busy`], naming it).
    /// Detached again by [`detach`](Self::detach) or on drop.
    pub fn attach(&mut self, iface: &str, mode: AttachMode) -> Result<(), AttachError> {
        let index = if_index(iface).ok_or_else(|| AttachError::NoSuchInterface(iface.into()))?;
        self.replaced_leftover = false;
        if self.attached.is_some() {
            self.detach().map_err(|source| AttachError::Attach {
                iface: iface.into(),
                source,
            })?;
        }
        let aya_mode = match mode {
            AttachMode::Generic => XdpMode::Skb,
            AttachMode::Native => XdpMode::Driver,
        };
        let link = match self.attach_once(index, aya_mode) {
            Ok(link) => link,
            Err(first) => {
                // Something holds the hook: remove it only if a dead run left it.
                match buffet_io::afxdp::clear_leftover_program(iface) {
                    Ok(Some(_)) => {}
                    // The hook was free: the attach failed for another reason.
                    Ok(None) if mode == AttachMode::Native && is_erange(&first) => {
                        return Err(AttachError::NativeMtu {
                            iface: iface.into(),
                            why: buffet_io::afxdp::native_mtu_refused(iface),
                        })
                    }
                    Ok(None) => {
                        return Err(AttachError::Attach {
                            iface: iface.into(),
                            source: first,
                        })
                    }
                    Err(e) => return Err(refused(iface, e)),
                }
                self.replaced_leftover = true;
                self.attach_once(index, aya_mode)
                    .map_err(|source| AttachError::Attach {
                        iface: iface.into(),
                        source,
                    })?
            }
        };
        self.attached = Some((iface.to_string(), link));
        Ok(())
    }

    fn attach_once(
        &mut self,
        index: u32,
        mode: XdpMode,
    ) -> Result<aya::programs::xdp::XdpLinkId, ProgramError> {
        let prog: &mut Xdp = self
            .ebpf
            .program_mut(PROGRAM_NAME)
            .expect("loaded program")
            .try_into()?;
        prog.attach_to_if_index(index, mode)
    }

    /// Whether the last [`attach`](Self::attach) replaced a program left on the
    /// interface.
    pub fn replaced_leftover(&self) -> bool {
        self.replaced_leftover
    }

    /// The interface the program is attached to.
    pub fn attached_to(&self) -> Option<&str> {
        self.attached.as_ref().map(|(i, _)| i.as_str())
    }

    /// Detaches the program from its interface, if attached.
    pub fn detach(&mut self) -> Result<(), ProgramError> {
        if let Some((_, link)) = self.attached.take() {
            let prog: &mut Xdp = self
                .ebpf
                .program_mut(PROGRAM_NAME)
                .expect("loaded program")
                .try_into()?;
            prog.detach(link)?;
        }
        Ok(())
    }
}

impl Drop for XdpDispatcher {
    fn drop(&mut self) {
        let _ = self.detach();
    }
}

/// A (mask, value) pair over the classification key.
type KeyPair = ([u64; KEY_WORDS], [u64; KEY_WORDS]);

fn rule_key(tuple: u32, bits: &[u64; KEY_WORDS]) -> RuleKey {
    RuleKey {
        tuple,
        bank: 0,
        bits: *bits,
    }
}

/// The decision a test-mode run recorded.
fn decision_of(
    rec: &DecisionRecord,
    migrated_from: Option<WorkerId>,
    overload: Option<OverloadReport>,
) -> XdpDecision {
    match rec.verdict {
        verdict::PASS => XdpDecision::Pass {
            worker: WorkerId(rec.worker),
            tenant: TenantSlot(rec.tenant),
            migrated_from,
            overload,
        },
        verdict::MALFORMED => XdpDecision::Malformed(
            *ParseError::ALL
                .get((rec.parse_error as usize).wrapping_sub(1))
                .unwrap_or(&ParseError::UnsupportedEtherType),
        ),
        verdict::POLICED => XdpDecision::Policed(TenantSlot(rec.tenant)),
        verdict::NO_WORKER => XdpDecision::NoLiveWorker,
        // UNMATCHED, and UNKNOWN (a rule naming a slot with no row).
        _ => XdpDecision::Unmatched,
    }
}

fn parse_event(bytes: &[u8]) -> Option<Event> {
    let b = bytes.get(..size_of::<EventRecord>())?;
    let u64_at = |i: usize| u64::from_ne_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    let u32_at = |i: usize| u32::from_ne_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    let u16_at = |i: usize| u16::from_ne_bytes(b[i..i + 2].try_into().expect("2 bytes"));
    let (slot, kind, tenant, worker, from) =
        (u64_at(0), u32_at(8), u32_at(12), u16_at(16), u16_at(18));
    match kind {
        EV_OVERLOAD => Some(Event::Overload {
            worker: WorkerId(worker),
            slot,
        }),
        EV_MIGRATION => Some(Event::Migration {
            tenant: TenantSlot(tenant),
            from: WorkerId(from),
            to: WorkerId(worker),
            slot,
        }),
        _ => None,
    }
}

fn if_index(iface: &str) -> Option<u32> {
    let path = format!("/sys/class/net/{iface}/ifindex");
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_of_another_size_than_the_loader_expects_is_refused_by_name() {
        let entries = MAX_QUEUES * XSK_STRIDE;
        assert!(check_size("bf_xsks", "entries", entries, entries).is_ok());
        let e = check_size("bf_xsks", "entries", 256, entries).unwrap_err();
        assert_eq!(
            e.to_string(),
            "XDP dispatcher map bf_xsks has 256 entries, this loader expects 16384 \
             (nic-firmware/xdp/buffet_xdp.h and buffet-xdp's layout.rs disagree)"
        );
    }

    #[test]
    fn each_queue_has_a_key_per_worker_and_the_last_queue_fits_the_map() {
        assert_eq!(xsk_key(0, WorkerId(0)).unwrap(), 0);
        assert_eq!(xsk_key(0, WorkerId(255)).unwrap(), 255);
        assert_eq!(xsk_key(1, WorkerId(0)).unwrap(), 256);
        assert_eq!(xsk_key(3, WorkerId(2)).unwrap(), 3 * 256 + 2);
        let last = xsk_key(MAX_QUEUES - 1, WorkerId(MAX_WORKERS - 1)).unwrap();
        assert_eq!(last, MAX_QUEUES * XSK_STRIDE - 1, "the map's last entry");
        let e = xsk_key(MAX_QUEUES, WorkerId(0)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "receive queue 64: the XDP dispatcher's XSKMAP holds sockets for queues 0 to 63 \
             (64 queues of 256 workers)"
        );
        let e = xsk_key(0, WorkerId(256)).unwrap_err();
        assert!(
            matches!(
                e,
                SocketError::WorkerOutOfRange {
                    worker: 256,
                    capacity: 256
                }
            ),
            "{e}"
        );
        assert!(check_queues(&[0, 1, 63]).is_ok());
        let e = check_queues(&[0, 70, 64]).unwrap_err();
        assert!(
            matches!(
                e,
                SocketError::QueueOutOfRange {
                    queue: 70,
                    capacity: 64
                }
            ),
            "{e}"
        );
    }
}
